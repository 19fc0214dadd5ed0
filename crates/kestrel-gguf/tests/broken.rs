//! A corpus of broken files, derived from a small valid file built with the writer: each must
//! give its specific error, through the one-shot parser, the stream (several chunkings) and
//! the file reader, and never panic.

mod common;

use std::path::PathBuf;

use common::{stream_collect, synthetic_file, synthetic_metadata};
use kestrel_gguf::{parse_header, stream_file, GgmlType, GgufError, GgufStreamReader, GgufWriter, MetadataValue, StreamEvent, TensorSpec};
use rand::{Rng, SeedableRng};

fn corpus_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("broken");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes.windows(needle.len()).position(|w| w == needle).unwrap()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the byte right after the length-prefixed string `s` (a key or tensor name).
fn after(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(bytes, &needle) + needle.len()
}

/// Field offsets of tensor `name`'s descriptor: (n_dims, first dim, type, data offset).
fn tensor_fields(bytes: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let n_dims_at = after(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    let type_at = n_dims_at + 4 + 8 * n_dims;
    (n_dims_at, n_dims_at + 4, type_at, type_at + 4)
}

/// Feeds `bytes` to every reader and checks each error with `expected`.
fn check(name: &str, bytes: &[u8], expected: impl Fn(&GgufError) -> bool) {
    for size in [1, 7, usize::MAX] {
        match stream_collect(bytes, &mut || size) {
            Ok(_) => panic!("{name}: chunk size {size}: stream accepted a broken file"),
            Err(e) => assert!(expected(&e), "{name}: chunk size {size}: unexpected error {e:?}"),
        }
    }
    let path = corpus_dir().join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    let e = stream_file(&path, &mut |_| Ok(())).unwrap_err();
    assert!(expected(&e), "{name}: file: unexpected error {e:?}");
}

/// Like `check`, and the one-shot header parse fails the same way.
fn check_header(name: &str, bytes: &[u8], expected: impl Fn(&GgufError) -> bool) {
    let e = parse_header(bytes).unwrap_err();
    assert!(expected(&e), "{name}: parse_header: unexpected error {e:?}");
    check(name, bytes, expected);
}

#[test]
fn synthetic_file_is_valid_and_streams_identically() {
    let bytes = synthetic_file();
    let h = parse_header(&bytes).unwrap();
    assert_eq!(h.metadata, synthetic_metadata());
    assert_eq!(h.tensors.len(), 5);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut random = || rng.random_range(1..40);
    let chunkings: [&mut dyn FnMut() -> usize; 4] = [&mut || 1, &mut || 7, &mut || 4096, &mut random];
    for sizes in chunkings {
        let got = stream_collect(&bytes, sizes).unwrap();
        assert_eq!(got.header.as_ref(), Some(&h));
        let indexes: Vec<usize> = got.tensors.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, h.data_order());
        for (i, data) in &got.tensors {
            assert_eq!(data.as_slice(), h.tensor_bytes(*i, &bytes).unwrap());
        }
    }
}

#[test]
fn truncated_at_every_offset() {
    let bytes = synthetic_file();
    let h = parse_header(&bytes).unwrap();
    // The header ends with the last descriptor ("e.q4_1", 3 dims), before its padding.
    let header_end = tensor_fields(&bytes, "e.q4_1").3 + 8;
    let data_end = h.tensors.iter().map(|t| h.data_start + t.offset + t.n_bytes()).max().unwrap() as usize;
    for len in 0..bytes.len() {
        let prefix = &bytes[..len];
        let streamed = stream_collect(prefix, &mut || 7);
        if len >= data_end {
            // Only trailing padding is missing.
            streamed.unwrap();
            continue;
        }
        let e = streamed.unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "prefix {len}: {e:?}");
        if len < header_end {
            assert!(matches!(parse_header(prefix), Err(GgufError::NeedMoreData { .. })), "prefix {len}");
        } else {
            assert!(e.to_string().contains("tensor"), "prefix {len}: {e}");
        }
    }
    // The file reader knows the size: a tensor past the end is caught from the header alone.
    let e = { check_truncated_file(&bytes[..data_end - 1]) };
    assert!(matches!(&e, GgufError::TensorOutOfBounds { name, .. } if name == "e.q4_1"), "{e:?}");
}

fn check_truncated_file(bytes: &[u8]) -> GgufError {
    let path = corpus_dir().join("truncated_data.gguf");
    std::fs::write(&path, bytes).unwrap();
    let mut tensors = 0;
    let e = stream_file(&path, &mut |event| {
        if let StreamEvent::Tensor { .. } = event {
            tensors += 1;
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(tensors, 0, "no tensor may be delivered from a file known to be short");
    e
}

#[test]
fn bad_magic_and_versions() {
    let good = synthetic_file();
    let mut b = good.clone();
    b[3] = b'G';
    check_header("bad_magic", &b, |e| matches!(e, GgufError::BadMagic { found } if found == b"GGUG"));
    // A web page, JSON or text saved or served in place of the model says what it is.
    for (start, says) in [(&b"<!doctype html><html>"[..], "an HTML page"), (b"{\"error\": \"not found\"}", "JSON"), (b"Not Found", "text")]
    {
        let e = parse_header(start).unwrap_err();
        assert!(matches!(e, GgufError::BadMagic { .. }), "{e:?}");
        assert!(e.to_string().contains(says), "{e}");
    }
    // A binary file that is not GGUF has no guess.
    let e = parse_header(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap_err();
    assert!(!e.to_string().contains("they read"), "{e}");
    for (name, version) in [("version_1", 1u32), ("version_99", 99)] {
        let mut b = good.clone();
        put_u32(&mut b, 4, version);
        check_header(name, &b, |e| matches!(e, GgufError::UnsupportedVersion { version: v } if *v == version));
    }
    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    check_header("big_endian", &b, |e| matches!(e, GgufError::BigEndian { .. }));
    // Version 2 has the same layout as 3.
    let mut b = good;
    put_u32(&mut b, 4, 2);
    assert_eq!(parse_header(&b).unwrap().version, 2);
}

#[test]
fn absurd_counts_and_lengths() {
    let good = synthetic_file();
    let mut b = good.clone();
    put_u64(&mut b, 8, 1 << 40);
    check_header(
        "absurd_tensor_count",
        &b,
        |e| matches!(e, GgufError::TooMany { what, count, offset: 8, .. } if what == "tensor" && *count == 1 << 40),
    );
    let mut b = good.clone();
    put_u64(&mut b, 16, u64::MAX);
    check_header("absurd_kv_count", &b, |e| matches!(e, GgufError::TooMany { offset: 16, .. }));
    // More tensors than described: the header runs into the data and ends in garbage or EOF.
    let mut b = good.clone();
    put_u64(&mut b, 8, 1000);
    check_header("tensor_count_too_large", &b, |e| !matches!(e, GgufError::TooMany { .. }));

    let mut b = good.clone();
    put_u64(&mut b, 24, 1 << 60);
    check_header("absurd_string_length", &b, |e| matches!(e, GgufError::StringTooLong { len, offset: 24, .. } if *len == 1 << 60));
    // Below the cap but past the end of the file: waits for data that never comes.
    let mut b = good.clone();
    put_u64(&mut b, 24, 1 << 20);
    check("string_past_eof", &b, |e| matches!(e, GgufError::Truncated { .. }));

    let count_at = after(&good, "t.strings") + 4 + 4;
    let mut b = good.clone();
    put_u64(&mut b, count_at, 1 << 40);
    check_header("absurd_array_count", &b, |e| matches!(e, GgufError::TooMany { what, .. } if what.contains("t.strings")));
    // Within the cap: refused without allocating for 2^30 strings.
    let mut b = good;
    put_u64(&mut b, count_at, 1 << 30);
    assert!(matches!(parse_header(&b), Err(GgufError::NeedMoreData { .. })));
    check("array_count_past_eof", &b, |e| matches!(e, GgufError::Truncated { .. }));
}

#[test]
fn bad_metadata_values() {
    let good = synthetic_file();
    let mut b = good.clone();
    put_u32(&mut b, 52, 13);
    check_header(
        "unknown_value_type",
        &b,
        |e| matches!(e, GgufError::UnknownValueType { type_id: 13, offset: 52, context } if context.contains("general.architecture")),
    );
    let mut b = good.clone();
    put_u32(&mut b, after(&good, "t.strings") + 4, 77);
    check_header("unknown_array_element_type", &b, |e| matches!(e, GgufError::UnknownValueType { type_id: 77, .. }));
    let mut b = good.clone();
    b[after(&good, "t.bool") + 4] = 2;
    check_header("bool_out_of_range", &b, |e| matches!(e, GgufError::MetadataValue { key, .. } if key.contains("t.bool")));
    let mut b = good.clone();
    b[after(&good, "t.i8") - 1] = 0xFF;
    check_header("key_not_utf8", &b, |e| matches!(e, GgufError::InvalidUtf8 { .. }));
    let mut b = good.clone();
    let at = after(&good, "t.u16") - 2;
    b[at..at + 2].copy_from_slice(b"32");
    check_header("duplicate_key", &b, |e| matches!(e, GgufError::DuplicateKey { key, .. } if key == "t.u32"));
    for (name, alignment) in [("alignment_24", 24u32), ("alignment_0", 0)] {
        let mut b = good.clone();
        put_u32(&mut b, after(&good, "general.alignment") + 4, alignment);
        check_header(name, &b, |e| matches!(e, GgufError::BadAlignment { value } if *value == alignment.into()));
    }
    // Type f32 instead of u32: same size, so only the type is wrong.
    let at = after(&good, "general.alignment");
    let mut b = good;
    put_u32(&mut b, at, 6);
    check_header("alignment_wrong_type", &b, |e| matches!(e, GgufError::MetadataType { key, .. } if key == "general.alignment"));

    // Arrays nested deeper than the cap, written by the writer (which does not judge depth).
    let mut deep = MetadataValue::U8(1);
    for _ in 0..10 {
        deep = MetadataValue::Array(vec![deep]);
    }
    let mut m = synthetic_metadata();
    m.set("t.deep", deep);
    let b = GgufWriter::new(Vec::new(), &m, &[]).unwrap().finish().unwrap();
    check_header("nesting_too_deep", &b, |e| matches!(e, GgufError::NestingTooDeep { context, .. } if context.contains("t.deep")));
}

#[test]
fn bad_tensor_descriptors() {
    let good = synthetic_file();
    let (a_ndims, a_dim0, a_type, _) = tensor_fields(&good, "a.f32");
    let (_, b_dim0, _, b_offset) = tensor_fields(&good, "b.q4_0");
    let (_, _, _, c_offset) = tensor_fields(&good, "c.q8_0");

    let mut b = good.clone();
    put_u32(&mut b, a_type, 4);
    check_header(
        "unknown_tensor_type",
        &b,
        |e| matches!(e, GgufError::UnknownTensorType { name, type_id: 4, offset } if name == "a.f32" && *offset == a_type as u64),
    );
    let mut b = good.clone();
    let offset = u64::from_le_bytes(good[b_offset..b_offset + 8].try_into().unwrap());
    put_u64(&mut b, b_offset, offset + 1);
    check_header("misaligned_offset", &b, |e| matches!(e, GgufError::MisalignedOffset { name, alignment: 32, .. } if name == "b.q4_0"));
    let mut b = good.clone();
    put_u64(&mut b, c_offset, offset);
    check_header("overlapping_tensors", &b, |e| matches!(e, GgufError::OverlappingTensors { .. }));
    let mut b = good.clone();
    put_u64(&mut b, a_dim0, 1 << 40);
    put_u64(&mut b, a_dim0 + 8, 1 << 40);
    check_header("dims_product_overflow", &b, |e| matches!(e, GgufError::BadShape { name, .. } if name == "a.f32"));
    let mut b = good.clone();
    put_u64(&mut b, b_dim0, 48);
    check_header(
        "row_not_whole_blocks",
        &b,
        |e| matches!(e, GgufError::BadShape { name, reason, .. } if name == "b.q4_0" && reason.contains("block size 32")),
    );
    let mut b = good.clone();
    put_u32(&mut b, a_ndims, 5);
    check_header("too_many_dims", &b, |e| matches!(e, GgufError::TooManyDims { n_dims: 5, .. }));
    let mut b = good.clone();
    let at = after(&good, "d.f16") - 5;
    b[at..at + 5].copy_from_slice(b"a.f32");
    check_header("duplicate_tensor_name", &b, |e| matches!(e, GgufError::DuplicateTensor { name, .. } if name == "a.f32"));
    // A huge data offset is accepted by the header alone, but not by the file reader.
    let mut b = good;
    put_u64(&mut b, c_offset, 1 << 40);
    check("tensor_offset_past_eof", &b, |e| matches!(e, GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn consumer_rejection_aborts_the_stream() {
    let bytes = synthetic_file();
    let mut reader = GgufStreamReader::new();
    let mut reject = |event: StreamEvent<'_>| match event {
        StreamEvent::Tensor { info, .. } if info.ggml_type == GgmlType::Q4_0 => {
            Err(GgufError::Rejected(format!("{} not wanted", info.name)))
        }
        _ => Ok(()),
    };
    let e = reader.push(&bytes, &mut reject).unwrap_err();
    assert_eq!(e.to_string(), "b.q4_0 not wanted");
    assert!(matches!(reader.push(&[0], &mut reject), Err(GgufError::StreamFailed)));
    assert!(matches!(reader.finish(), Err(GgufError::StreamFailed)));
}

#[test]
fn writer_rejects_bad_input() {
    let spec = |dims: &[u64], ggml_type| TensorSpec { name: "w".into(), dims: dims.to_vec(), ggml_type };
    let m = synthetic_metadata();
    assert!(matches!(GgufWriter::new(Vec::new(), &m, &[spec(&[33], GgmlType::Q8_0)]), Err(GgufError::BadShape { .. })));
    assert!(matches!(
        GgufWriter::new(Vec::new(), &m, &[spec(&[32], GgmlType::Q8_0), spec(&[1], GgmlType::F32)]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    let mut w = GgufWriter::new(Vec::new(), &m, &[spec(&[32], GgmlType::Q8_0)]).unwrap();
    assert!(matches!(w.write_tensor(&[0; 33]), Err(GgufError::SizeMismatch { .. })));
    let mut mixed = m.clone();
    mixed.set("mixed", MetadataValue::Array(vec![MetadataValue::U8(1), MetadataValue::Bool(true)]));
    assert!(matches!(GgufWriter::new(Vec::new(), &mixed, &[]), Err(GgufError::MetadataType { .. })));
    let w = GgufWriter::new(Vec::new(), &m, &[spec(&[32], GgmlType::Q8_0)]).unwrap();
    assert!(matches!(w.finish(), Err(GgufError::SizeMismatch { .. })));
}

/// Random corruption and random chunking: any result is fine, a panic is not.
#[test]
fn random_corruption_never_panics() {
    let good = synthetic_file();
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..b.len());
            b[at] = rng.random();
        }
        if rng.random_bool(0.3) {
            b.truncate(rng.random_range(0..b.len()));
        }
        let _ = parse_header(&b);
        let _ = stream_collect(&b, &mut || rng.random_range(1..64));
    }
}
