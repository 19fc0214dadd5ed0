//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::sync::OnceLock;

use kestrel_gguf::{GgmlType, GgufError, GgufHeader, GgufStreamReader, GgufWriter, Metadata, MetadataValue, StreamEvent, TensorSpec};

/// The default model; tests that need it fail (never skip) when it is missing.
pub fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "default model missing at {}: run scripts/fetch-model.sh", path.display());
    path
}

/// The default model's bytes, read once per test binary.
pub fn model_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(model_path()).expect("read default model"))
}

/// What a stream delivered: the header and each tensor's (index, bytes) in delivery order.
#[derive(Debug)]
pub struct Delivered {
    pub header: Option<GgufHeader>,
    pub tensors: Vec<(usize, Vec<u8>)>,
}

/// Streams `bytes` in chunks whose sizes come from `sizes` (cycled), collecting everything.
pub fn stream_collect(bytes: &[u8], sizes: &mut dyn FnMut() -> usize) -> Result<Delivered, GgufError> {
    let mut delivered = Delivered { header: None, tensors: Vec::new() };
    let mut reader = GgufStreamReader::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = sizes().clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        reader.push(chunk, &mut |event| {
            match event {
                StreamEvent::Header(h) => delivered.header = Some(h.clone()),
                StreamEvent::Tensor { index, bytes, .. } => delivered.tensors.push((index, bytes.to_vec())),
            }
            Ok(())
        })?;
    }
    assert_eq!(reader.bytes_consumed(), bytes.len() as u64);
    reader.finish()?;
    Ok(delivered)
}

/// Metadata exercising every value type, nested arrays included.
pub fn synthetic_metadata() -> Metadata {
    use MetadataValue as V;
    let mut m = Metadata::new();
    m.set("general.architecture", V::String("llama".into()));
    m.set("general.alignment", V::U32(32));
    m.set("t.u8", V::U8(200));
    m.set("t.i8", V::I8(-100));
    m.set("t.u16", V::U16(60000));
    m.set("t.i16", V::I16(-30000));
    m.set("t.u32", V::U32(4_000_000_000));
    m.set("t.i32", V::I32(-2_000_000_000));
    m.set("t.u64", V::U64(1 << 60));
    m.set("t.i64", V::I64(-(1 << 60)));
    m.set("t.f32", V::F32(1.5));
    m.set("t.f64", V::F64(-2.25));
    m.set("t.bool", V::Bool(true));
    m.set("t.strings", V::Array(vec![V::String("a".into()), V::String("ü€".into()), V::String(String::new())]));
    m.set("t.ints", V::Array(vec![V::I32(1), V::I32(-2), V::I32(3)]));
    m.set("t.nested", V::Array(vec![V::Array(vec![V::U8(1), V::U8(2)]), V::Array(vec![V::U8(3)])]));
    m
}

/// Tensor specs of the synthetic file: one of each plain type the runtime supports.
pub fn synthetic_specs() -> Vec<TensorSpec> {
    let spec = |name: &str, dims: &[u64], ggml_type| TensorSpec { name: name.into(), dims: dims.to_vec(), ggml_type };
    vec![
        spec("a.f32", &[8, 2], GgmlType::F32),
        spec("b.q4_0", &[64, 2], GgmlType::Q4_0),
        spec("c.q8_0", &[32], GgmlType::Q8_0),
        spec("d.f16", &[3], GgmlType::F16),
        spec("e.q4_1", &[32, 1, 2], GgmlType::Q4_1),
    ]
}

/// A small valid GGUF v3 file built with the writer; tensor data is a byte pattern distinct
/// per tensor.
pub fn synthetic_file() -> Vec<u8> {
    let specs = synthetic_specs();
    let mut w = GgufWriter::new(Vec::new(), &synthetic_metadata(), &specs).expect("writer");
    let sizes: Vec<u64> = w.tensors().iter().map(|t| t.n_bytes()).collect();
    for (i, n) in sizes.into_iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|b| (b as u8).wrapping_mul(7).wrapping_add(i as u8 * 31)).collect();
        w.write_tensor(&data).expect("write tensor");
    }
    w.finish().expect("finish")
}
