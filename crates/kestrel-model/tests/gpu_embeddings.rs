//! Encoders loaded for a GPU run their layers there: their pooled vectors against the CPU
//! backend's on the real all-MiniLM-L6-v2 and on random-weight files of each architecture,
//! pooling and weight type, llama.cpp's recorded vectors, and a reranker's ranking. Inputs of
//! different lengths are packed into one pass. Decoder embedding models run the chat graph on
//! the GPU, against the CPU backend's vectors.
//!
//! The bound, cosine >= 0.9999 with the CPU's vector. The two differ in three ways: the order
//! of f32 sums (relative 1e-6 per product); BERT's GELU, the CPU's ggml f16 table against the
//! GPU's tanh formula in f32 (the table rounds input and output to f16, 2^-11 relative each, so
//! an activation differs by up to ~1e-3 relative, and the FFN's output, a sum of `ffn` such terms
//! of random sign, by about 1e-3 / sqrt(ffn) of its size); and, the largest, the CPU backend's
//! quantized products (Q8_0, Q4_0: as ggml, it quantizes each activation row to 8 bits per
//! block, 2^-8 relative per value, where the GPU multiplies f32 activations), which move a
//! product's output by ~2^-8 / sqrt(block) ~ 7e-4 relative. A relative difference e of the vector
//! gives 1 - cos ~ e^2 / 2: a few 1e-3 through the post-normed layers is 1 - cos of a few 1e-6
//! to 1e-5 (measured: 4e-5 on random Q8_0 weights, 2e-7 on MiniLM's F32), within the 1e-4 the
//! bound allows, while a real mistake moves it far more (measured: RoPE left out, 0.9956; a token
//! attending across inputs, 0.83 here and 0.58 against llama.cpp).

mod common;
// Its llama.cpp reranking is embeddings.rs's; this file compares with the CPU backend only.
#[allow(dead_code)]
#[path = "common/synthetic_encoder.rs"]
mod synthetic_encoder;

use pollster::block_on;
use std::path::Path;

use kestrel_model::{EmbedInput, EmbedOptions, Embedder, LoadOptions, LoadedModel};
use serde::Deserialize;
use synthetic_encoder::EVERY_ARCHITECTURE;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    tokens: Vec<u32>,
    vector: Vec<f32>,
}

fn minilm_path() -> std::path::PathBuf {
    common::repo_root().join("models/all-MiniLM-L6-v2.f32.gguf")
}

fn embedder(loaded: Result<LoadedModel, kestrel_model::ModelError>, path: &Path) -> Embedder {
    match loaded.unwrap_or_else(|e| panic!("load {}: {e}", path.display())) {
        LoadedModel::Embedding(e) => *e,
        LoadedModel::Chat(_) => panic!("{} loaded as a chat model", path.display()),
    }
}

/// The model at `path` on the GPU and on the CPU backend.
fn both(path: &Path) -> (Embedder, Embedder) {
    let gpu = embedder(block_on(kestrel_model::load_file_any(&common::gpu(), path, LoadOptions::default(), &mut |_| {})), path);
    let cpu = embedder(block_on(kestrel_model::load_file_cpu_any(path, LoadOptions::default(), &mut |_| {})), path);
    assert_eq!((gpu.backend(), cpu.backend()), ("gpu", "cpu"), "{}", path.display());
    (gpu, cpu)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Unnormalized vectors; an input past the context is cut to it.
const RAW: EmbedOptions = EmbedOptions { dimensions: None, normalize: false, truncate: true };

/// Texts of different lengths (3 to about 50 tokens), embedded in one call.
fn texts() -> Vec<String> {
    let mut texts: Vec<String> = ["hi", "The quick brown fox jumps over the lazy dog.", "Rust and WebAssembly run models in the browser."]
        .map(String::from)
        .to_vec();
    // About 50 tokens: within the smallest synthetic context (64).
    texts.push("a long input about embeddings and attention ".repeat(6));
    texts
}

/// Every vector of one packed call on the GPU within the bound of the CPU's.
fn assert_gpu_matches_cpu(what: &str, gpu: &Embedder, cpu: &Embedder, inputs: &[EmbedInput<'_>]) {
    let (g, c) =
        (block_on(gpu.embed(inputs, &RAW)).expect("embed on the GPU"), block_on(cpu.embed(inputs, &RAW)).expect("embed on the CPU"));
    assert_eq!(g.prompt_tokens, c.prompt_tokens);
    let mut worst = 1.0f64;
    for (i, (g, c)) in g.vectors.iter().zip(&c.vectors).enumerate() {
        let cos = cosine(g, c);
        assert!(cos >= 0.9999, "{what}: input {i}: cosine {cos} between the GPU's and the CPU's vectors");
        worst = worst.min(cos);
    }
    eprintln!("{what}: lowest cosine GPU/CPU {worst:.8}");
}

#[test]
fn minilm_on_the_gpu_matches_the_cpu_and_llama_cpp() {
    let path = minilm_path();
    let (gpu, cpu) = both(&path);
    let reference: Reference =
        serde_json::from_str(&std::fs::read_to_string(common::repo_root().join("tests/data/embeddings/minilm.json")).expect("read"))
            .expect("parse minilm.json");
    let inputs: Vec<EmbedInput<'_>> = reference.cases.iter().map(|c| EmbedInput::Tokens(&c.tokens)).collect();
    let packed = block_on(gpu.embed(&inputs, &RAW)).expect("embed on the GPU");
    for (case, v) in reference.cases.iter().zip(&packed.vectors) {
        let cos = cosine(v, &case.vector);
        assert!(cos >= 0.999, "{:?}: cosine {cos} with llama.cpp's vector", case.text);
    }
    assert_gpu_matches_cpu("minilm reference tokens", &gpu, &cpu, &inputs);
    let texts = texts();
    let inputs: Vec<EmbedInput<'_>> = texts.iter().map(|t| EmbedInput::Text(t)).collect();
    assert_gpu_matches_cpu("minilm texts", &gpu, &cpu, &inputs);
    // An input of the whole context (512 tokens: eight tiles of the attention's keys) packed
    // between short ones.
    let long = "kestrels hover over the fields, watching for voles ".repeat(80);
    let inputs = [EmbedInput::Text("a short one"), EmbedInput::Text(&long), EmbedInput::Text("and another")];
    assert_eq!(gpu.tokens(inputs[1], true).expect("tokens").len(), 512);
    assert_gpu_matches_cpu("minilm with a 512-token input", &gpu, &cpu, &inputs);
}

#[test]
fn every_architecture_and_pooling_matches_the_cpu() {
    let models = EVERY_ARCHITECTURE;
    let texts = texts();
    let inputs: Vec<EmbedInput<'_>> = texts.iter().map(|t| EmbedInput::Text(t)).collect();
    for m in models {
        // embeddings.rs's models exactly: the file name has no seed, so both tests write the
        // same bytes to it.
        let path = m.write(&minilm_path());
        let (gpu, cpu) = both(&path);
        assert_gpu_matches_cpu(&m.file_name(), &gpu, &cpu, &inputs);
    }
}

#[test]
fn a_reranker_on_the_gpu_ranks_as_on_the_cpu() {
    let m = synthetic_encoder::RERANKER;
    let (gpu, cpu) = both(&m.write(&minilm_path()));
    let query = "how do birds fly";
    let documents = ["Birds fly by flapping their wings.", "The stock market closed higher.", "Penguins are birds that cannot fly.", "fly"];
    let (g, c) = (
        block_on(gpu.rerank(query, &documents)).expect("rerank on the GPU"),
        block_on(cpu.rerank(query, &documents)).expect("rerank on the CPU"),
    );
    let order = |s: &[f32]| {
        let mut i: Vec<usize> = (0..s.len()).collect();
        i.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        i
    };
    assert_eq!(order(&g.scores), order(&c.scores), "GPU scores {:?}, CPU {:?}", g.scores, c.scores);
    for (g, c) in g.scores.iter().zip(&c.scores) {
        // Probabilities from the head's logit: the vectors' bound moves them by ~1e-3 at most.
        assert!((g - c).abs() < 2e-3, "GPU score {g}, CPU {c}");
    }
}

/// Decoder embedding models loaded for a GPU run the chat graph there without the LM head
/// (Qwen3's shape with last-token pooling, Qwen2's with mean pooling): within the bound of the
/// CPU backend's vectors, which embeddings.rs checks against llama.cpp. Both have F32 weights and
/// an f16 KV cache, so only the order of sums differs.
#[test]
fn decoder_embedding_models_on_the_gpu_match_the_cpu() {
    use common::synthetic::{pooled, QWEN2_F32, QWEN3_F32};
    let texts = texts();
    let inputs: Vec<EmbedInput<'_>> = texts.iter().map(|t| EmbedInput::Text(t)).collect();
    for (m, pooling) in [(QWEN3_F32, 3u32), (QWEN2_F32, 1)] {
        let (path, name) = pooled(&m, pooling);
        let (gpu, cpu) = both(&path);
        assert_gpu_matches_cpu(&name, &gpu, &cpu, &inputs);
    }
}

/// The estimate's GPU weights are what the device holds once MiniLM's layers are loaded, within
/// 1 % (allocations round up to 16 bytes), and while they load it holds no more than that plus
/// the staging copies of two pieces of uploads (`kestrel_gpu::WRITE_PIECE`): the encoder's
/// loader gives them back as it goes, as the chat loader does. Without that, staging held
/// another copy of every layer (42 MB here, over the bound).
#[test]
fn the_gpu_estimate_is_what_the_device_allocates() {
    use kestrel_model::estimate::Estimate;
    let path = minilm_path();
    let header = kestrel_gguf::parse_header(&std::fs::read(&path).expect("read")).expect("header");
    let estimate = Estimate::from_header(&header, None, Default::default(), 1).expect("estimate");
    assert_eq!(estimate.cpu_only, None);
    // A fresh device: nothing another test left on a pooled one is in the count.
    let gpu = common::own_gpu();
    let before = common::settled_gpu_bytes(&gpu);
    let mut peak = 0u64;
    let mut sample = |_: &kestrel_model::LoadProgress| peak = peak.max(gpu.allocated_bytes().expect("an allocator report"));
    let model = embedder(block_on(kestrel_model::load_file_any(&gpu, &path, LoadOptions::default(), &mut sample)), &path);
    assert_eq!(model.backend(), "gpu");
    let held = common::settled_gpu_bytes(&gpu) - before;
    let off = held.abs_diff(estimate.weight_bytes) as f64 / estimate.weight_bytes as f64;
    assert!(off <= 0.01, "the device holds {held} bytes of layers, the estimate {}", estimate.weight_bytes);
    let bound = estimate.weight_bytes + 2 * kestrel_gpu::WRITE_PIECE as u64;
    assert!(peak - before <= bound, "{} bytes while loading, over {bound}", peak - before);
}
