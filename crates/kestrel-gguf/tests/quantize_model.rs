//! Whole-model quantization of the default model.

mod common;

use kestrel_gguf::{
    dequantize, parse_header, quantize, quantize_model, GgmlType, GgufError, GgufWriter, Metadata, MetadataValue, QuantizeTarget,
    TensorSpec,
};
use rand::{Rng, SeedableRng};

fn dequantized(ty: GgmlType, bytes: &[u8], n: u64) -> Vec<f32> {
    let mut out = vec![0f32; n as usize];
    dequantize(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn quantize_default_model_to_q8_0() {
    let input = common::model_path();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quantize_model");
    std::fs::create_dir_all(&dir).unwrap();
    let output = dir.join("SmolLM2-135M-Instruct.Q8_0.gguf");
    let mut calls = Vec::new();
    let report = quantize_model(&input, &output, GgmlType::Q8_0, &mut |done, total| calls.push((done, total))).unwrap();
    assert_eq!(calls.len(), 272);
    assert_eq!(calls.last(), Some(&(272, 272)));
    // 210 Q4_1 matrices converted; the Q8_0 embedding and 61 F32 norms copied.
    assert_eq!((report.tensors, report.converted, report.copied, report.fallback), (272, 210, 62, 0));

    let original_bytes = common::model_bytes();
    let original = parse_header(original_bytes).unwrap();
    let out_bytes = std::fs::read(&output).unwrap();
    let out = parse_header(&out_bytes).unwrap();
    assert_eq!(report.output_bytes, out.tensors.iter().map(|t| t.n_bytes()).sum::<u64>());
    assert_eq!(report.input_bytes, original.tensors.iter().map(|t| t.n_bytes()).sum::<u64>());
    assert_eq!(out.version, 3);
    // Metadata preserved in order, with the file type updated.
    assert_eq!(out.metadata.len(), original.metadata.len());
    for ((k1, v1), (k2, v2)) in original.metadata.iter().zip(out.metadata.iter()) {
        assert_eq!(k1, k2);
        if k1 == "general.file_type" {
            assert_eq!(v2, &MetadataValue::U32(7));
        } else {
            assert_eq!(v1, v2, "{k1}");
        }
    }
    assert_eq!(out.tensors.len(), original.tensors.len());
    for (i, t) in original.tensors.iter().enumerate() {
        let j = out.tensors.iter().position(|o| o.name == t.name).unwrap();
        let o = &out.tensors[j];
        assert_eq!(o.dims, t.dims, "{}", t.name);
        let expected_type = if t.dims.len() == 1 { GgmlType::F32 } else { GgmlType::Q8_0 };
        assert_eq!(o.ggml_type, expected_type, "{}", t.name);
        let a_bytes = original.tensor_bytes(i, original_bytes).unwrap();
        let b_bytes = out.tensor_bytes(j, &out_bytes).unwrap();
        if t.ggml_type == o.ggml_type {
            assert!(a_bytes == b_bytes, "{} must be copied unchanged", t.name);
            continue;
        }
        // Q4_1 -> Q8_0: the requantization error is at most half a Q8_0 step of each block
        // (plus the f16 rounding of its scale).
        let a = dequantized(t.ggml_type, a_bytes, t.n_elements());
        let b = dequantized(o.ggml_type, b_bytes, o.n_elements());
        for (xs, ys) in a.chunks(32).zip(b.chunks(32)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bound = amax / 127.0 * 0.5 + amax * 1e-3 + 1e-6;
            for (x, y) in xs.iter().zip(ys) {
                assert!((x - y).abs() <= bound, "{}: {x} vs {y}", t.name);
            }
        }
    }
}

#[test]
fn quantize_model_rejects_unsupported_target_and_missing_input() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let e = quantize_model(&common::model_path(), &dir.join("x.gguf"), GgmlType::Q2_K, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, GgufError::UnsupportedType { ty: GgmlType::Q2_K, .. }));
    let e = quantize_model(&dir.join("missing.gguf"), &dir.join("y.gguf"), GgmlType::Q8_0, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(!dir.join("y.gguf").exists(), "no partial output is left behind");
}

/// A 4-layer llama model with F32 weights: hidden 256, feed-forward 320 (not whole K-quant
/// super-blocks, so ffn_down falls back), vocabulary 512 and a separate output matrix.
fn write_synthetic_llama(path: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let mut m = Metadata::new();
    m.set("general.architecture", MetadataValue::String("llama".into()));
    m.set("llama.block_count", MetadataValue::U32(4));
    m.set("general.file_type", MetadataValue::U32(0));
    let mut specs = vec![("token_embd.weight".to_string(), vec![256, 512])];
    for i in 0..4 {
        for (s, dims) in [
            ("attn_norm.weight", vec![256]),
            ("attn_q.weight", vec![256, 256]),
            ("attn_k.weight", vec![256, 64]),
            ("attn_v.weight", vec![256, 64]),
            ("attn_output.weight", vec![256, 256]),
            ("ffn_norm.weight", vec![256]),
            ("ffn_gate.weight", vec![256, 320]),
            ("ffn_up.weight", vec![256, 320]),
            ("ffn_down.weight", vec![320, 256]),
        ] {
            specs.push((format!("blk.{i}.{s}"), dims));
        }
    }
    specs.push(("output_norm.weight".to_string(), vec![256]));
    specs.push(("output.weight".to_string(), vec![256, 512]));
    let tensor_specs: Vec<TensorSpec> =
        specs.iter().map(|(name, dims)| TensorSpec { name: name.clone(), dims: dims.clone(), ggml_type: GgmlType::F32 }).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut w = GgufWriter::new(Vec::new(), &m, &tensor_specs).unwrap();
    let mut values = Vec::new();
    for (name, dims) in specs {
        let n = dims.iter().product::<u64>() as usize;
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-0.1..0.1)).collect();
        w.write_tensor(&quantize(GgmlType::F32, &v).unwrap()).unwrap();
        values.push((name, v));
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
    values
}

#[test]
fn quantize_synthetic_llama_to_q4_k_m() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quantize_q4_k_m");
    std::fs::create_dir_all(&dir).unwrap();
    let (input, output) = (dir.join("f32.gguf"), dir.join("q4_k_m.gguf"));
    let originals = write_synthetic_llama(&input);
    let report = quantize_model(&input, &output, QuantizeTarget::Q4KM, &mut |_, _| {}).unwrap();

    // use_more_bits(i, 4) picks layers 2 and 3; ffn_down rows of 320 fall back
    // (Q6_K -> Q8_0, Q4_K -> Q5_0).
    let expected = |name: &str| -> GgmlType {
        let more = name.starts_with("blk.2.") || name.starts_with("blk.3.");
        match name {
            "output.weight" => GgmlType::Q6_K,
            n if n.ends_with("_norm.weight") => GgmlType::F32,
            n if n.ends_with("attn_v.weight") && more => GgmlType::Q6_K,
            n if n.ends_with("ffn_down.weight") && more => GgmlType::Q8_0,
            n if n.ends_with("ffn_down.weight") => GgmlType::Q5_0,
            _ => GgmlType::Q4_K,
        }
    };
    let bytes = std::fs::read(&output).unwrap();
    let out = parse_header(&bytes).unwrap();
    assert_eq!(out.metadata.get("general.file_type"), Some(&MetadataValue::U32(15)));
    assert_eq!(out.tensors.len(), originals.len());
    for (i, t) in out.tensors.iter().enumerate() {
        let (name, values) = &originals[i];
        assert_eq!(&t.name, name);
        assert_eq!(t.ggml_type, expected(name), "{name}");
        // Exactly what quantizing the original values as that type gives.
        let data = out.tensor_bytes(i, &bytes).unwrap();
        assert!(data == quantize(t.ggml_type, values).unwrap(), "{name}");
        let mut back = vec![0f32; values.len()];
        dequantize(t.ggml_type, data, &mut back).unwrap();
        let worst = values.iter().zip(&back).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 0.02, "{name}: error {worst}");
    }
    assert_eq!(report.tensors, 39);
    assert_eq!((report.converted, report.copied, report.fallback), (30, 9, 4));
    assert_eq!(report.by_type, [(GgmlType::F32, 9), (GgmlType::Q5_0, 2), (GgmlType::Q8_0, 2), (GgmlType::Q4_K, 23), (GgmlType::Q6_K, 3),]);
}
