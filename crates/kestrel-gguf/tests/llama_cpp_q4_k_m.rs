//! `kestrel quantize --type q4_k_m` against llama.cpp's own quantizer: both quantize the default
//! Q4_1 model (dequantized to f32 first) with the Q4_K_M recipe, and every tensor must come out
//! with the same type and the same bytes as in llama.cpp's file (models/…Q4_K_M.gguf, made by
//! scripts/make-q4-k-m.sh with tools/llama-cpp/quantize.py; its sha256 is checked there). This
//! covers the recipe (which tensor gets which type, the fallbacks for 576-wide rows) and the
//! Q5_0, Q8_0, Q4_K and Q6_K quantizers on 135M real weights.

use std::collections::HashMap;
use std::path::PathBuf;

use kestrel_gguf::{quantize_model, read_file, QuantizeTarget};

fn model(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name);
    assert!(path.exists(), "{} is missing: run scripts/make-q4-k-m.sh", path.display());
    path
}

#[test]
fn q4_k_m_equals_llama_cpp_tensor_for_tensor() {
    let source = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let theirs_path = model("SmolLM2-135M-Instruct.Q4_K_M.gguf");
    let ours_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kestrel-q4_k_m.gguf");
    let report = quantize_model(&source, &ours_path, QuantizeTarget::Q4KM, &mut |_, _| {}).expect("quantize");
    eprintln!("kestrel's Q4_K_M: {:?}", report.by_type);

    let (ours, ours_data) = read_file(&ours_path).expect("read ours");
    let (theirs, theirs_data) = read_file(&theirs_path).expect("read llama.cpp's");
    assert_eq!(ours.tensors.len(), theirs.tensors.len(), "tensor count");
    let theirs_by_name: HashMap<&str, usize> = theirs.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut differing = Vec::new();
    for (info, data) in ours.tensors.iter().zip(&ours_data) {
        let &j = theirs_by_name.get(info.name.as_str()).unwrap_or_else(|| panic!("llama.cpp's file has no {}", info.name));
        let want = &theirs.tensors[j];
        assert_eq!(info.ggml_type, want.ggml_type, "{}: type", info.name);
        assert_eq!(info.dims, want.dims, "{}: shape", info.name);
        if *data != theirs_data[j] {
            let bytes = data.iter().zip(&theirs_data[j]).filter(|(a, b)| a != b).count();
            differing.push(format!("{} ({}, {bytes} of {} bytes differ)", info.name, info.ggml_type, data.len()));
        }
    }
    assert!(differing.is_empty(), "tensors that differ from llama.cpp's: {differing:#?}");
}
