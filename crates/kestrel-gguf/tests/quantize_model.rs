//! Whole-model quantization of the default model.

mod common;

use kestrel_gguf::{dequantize, parse_header, quantize_model, GgmlType, GgufError, MetadataValue};

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
    let report = quantize_model(&input, &output, GgmlType::Q8_0, &mut |done, total| {
        calls.push((done, total))
    })
    .unwrap();
    assert_eq!(calls.len(), 272);
    assert_eq!(calls.last(), Some(&(272, 272)));
    // 210 Q4_1 matrices converted; the Q8_0 embedding and 61 F32 norms copied.
    assert_eq!(
        (
            report.tensors,
            report.converted,
            report.copied,
            report.fallback_f16
        ),
        (272, 210, 62, 0)
    );

    let original_bytes = common::model_bytes();
    let original = parse_header(original_bytes).unwrap();
    let out_bytes = std::fs::read(&output).unwrap();
    let out = parse_header(&out_bytes).unwrap();
    assert_eq!(
        report.output_bytes,
        out.tensors.iter().map(|t| t.n_bytes()).sum::<u64>()
    );
    assert_eq!(
        report.input_bytes,
        original.tensors.iter().map(|t| t.n_bytes()).sum::<u64>()
    );
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
        let expected_type = if t.dims.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::Q8_0
        };
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
    let e = quantize_model(
        &common::model_path(),
        &dir.join("x.gguf"),
        GgmlType::Q4_K,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(
        e,
        GgufError::UnsupportedType {
            ty: GgmlType::Q4_K,
            ..
        }
    ));
    let e = quantize_model(
        &dir.join("missing.gguf"),
        &dir.join("y.gguf"),
        GgmlType::Q8_0,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(
        !dir.join("y.gguf").exists(),
        "no partial output is left behind"
    );
}
