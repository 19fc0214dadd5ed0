//! The GPU forward pass against the CPU reference forward pass (plain f32, from the kernels'
//! references) on the same file: the default Q4_1 model for prompts of 1, 7 and 200 tokens (200
//! spans two prefill chunks of 128), Q8_0 / Q4_0 / F16 versions of it made by `kestrel quantize`
//! for 1, 7 and 40, llama.cpp's Q4_K_M of it (Q5_0, Q8_0, Q4_K and Q6_K tensors, with Q, K and V
//! of different types in 14 layers) for 1, 7 and 130 tokens, and random-weight models of other
//! architectures, one of them (Gemma 2) for 2,048 tokens.
//!
//! Both passes keep K and V as the GPU cache does (f16 by default: the reference rounds them the
//! same way), so the bound measures the kernels, not the cache's precision; the f32 cache is
//! checked on the default model too.
//!
//! Tolerance: the same argmax, and every logit within a bound of max|logit|:
//! - f32 cache: 1e-4. The two passes differ only in summation order; over 30 layers that grows
//!   to ~3e-6 relative here.
//! - f16 cache: 1e-3. Where a K or V value's two f32 results (GPU and CPU) fall on either side of
//!   an f16 rounding boundary, the caches differ by one f16 step (2^-10 of the value) there, and
//!   later layers carry it on; measured up to 2.1e-4 relative here (Q4_1, 7 tokens).

mod common;

use std::path::Path;

use kestrel_gguf::GgmlType;
use kestrel_gpu::GpuOptions;
use kestrel_model::reference::ReferenceModel;
use kestrel_model::{LoadOptions, Model};
use kestrel_ops::params::KvType;

/// Bounds on |gpu - cpu| / max|logit| by the cache's value type (see the file's doc).
fn relative_tolerance(kv: KvType) -> f32 {
    match kv {
        KvType::F32 => 1e-4,
        KvType::F16 => 1e-3,
    }
}

const CONTEXT: usize = 512;

fn check_file(path: &Path, label: &str, lengths: &[usize]) {
    check_model(common::load(path, CONTEXT), path, label, lengths, CONTEXT);
}

/// The reference's logits, by file, context, cache type and prompt length: computed once per
/// binary, so the tests that check the same file (the default model's) share them.
static REFERENCE_LOGITS: common::Shared<Vec<f32>> = common::Shared::new();

/// `model`, loaded from `path` with a context of `context`, against the reference.
fn check_model(mut model: Model, path: &Path, label: &str, lengths: &[usize], context: usize) {
    let bench_ids = common::ids(&common::greedy_reference()["bench_prompt"]["ids"]);
    let kv = model.kv_cache();
    // Built at its first use (the logits may all be known already) and run for each prompt from
    // position 0, which overwrites every cache row the prompt reads: as a fresh one would.
    let mut reference: Option<ReferenceModel> = None;
    for &n in lengths {
        // The bench prompt, repeated where `n` is longer.
        let prompt: Vec<u32> = bench_ids.iter().cycle().take(n).copied().collect();
        let prompt = prompt.as_slice();
        let gpu = pollster::block_on(model.prompt_logits(prompt)).expect("gpu logits");
        let key = format!("{} {context} {} {n}", path.display(), kv.name());
        let want = REFERENCE_LOGITS.get_or_make(&key, || {
            let reference = reference.get_or_insert_with(|| {
                let (header, tensors) = kestrel_gguf::read_file(path).expect("read the model");
                ReferenceModel::new(&header, &tensors, context, kv).expect("reference model")
            });
            reference.pos = 0;
            reference.forward(prompt).expect("reference logits")
        });
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = gpu.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
        eprintln!(
            "{label} ({} KV) {n:>3} tokens: max |gpu - cpu| = {worst:.2e} ({:.2e} of max |logit| {scale:.1})",
            kv.name(),
            worst / scale
        );
        assert!(worst <= relative_tolerance(kv) * scale, "{label}, {n} tokens: logits differ by {worst} (max |logit| {scale})");
        assert_eq!(common::argmax(&gpu), common::argmax(&want), "{label}, {n} tokens: argmax differs");
    }
}

#[test]
fn q4_1_default_model_matches_cpu_reference() {
    check_file(&common::default_model_path(), "Q4_1", &[1, 7, 200]);
}

#[test]
fn f32_kv_cache_matches_cpu_reference() {
    let path = common::default_model_path();
    let options = LoadOptions { context_length: Some(CONTEXT), kv_cache: KvType::F32, ..LoadOptions::default() };
    check_model(common::load_with(&common::gpu(), &path, options), &path, "Q4_1", &[1, 7], CONTEXT);
}

#[test]
fn q4_k_m_model_matches_cpu_reference() {
    check_file(&common::q4_k_m_model_path(), "Q4_K_M", &[1, 7, 130]);
}

/// On a device whose storage bindings hold at most 4 MiB, the 17.7 MB embedding table (also
/// the LM head: SmolLM2 ties them) cannot be one buffer: it loads as 5 row shards, gathered and
/// multiplied shard by shard (the load fails outright without them, as the device refuses the
/// larger buffer). Large vocabularies need this on devices with WebGPU's default 128 MiB limit.
#[test]
fn row_sharded_tables_match_cpu_reference() {
    let options = GpuOptions { max_storage_binding: Some(4 << 20), ..GpuOptions::default() };
    let gpu = common::gpu_with(&options);
    let path = common::default_model_path();
    check_model(common::load_on(&gpu, &path, CONTEXT), &path, "Q4_1 in 4 MiB bindings", &[1, 7], CONTEXT);
}

/// A split model (`kestrel_gguf::split_model`, as gguf-split writes them) loads from its first
/// shard as the whole file does, to the bit: shards of 4 tensors put a layer's gate and up, and
/// its Q, K and V, in different shards, which the loader fuses (or, on the Q4_K_M file, where
/// they differ in type in 14 layers, keeps apart) as for one file.
#[test]
fn split_models_give_the_whole_files_logits() {
    let gpu = common::gpu();
    for (path, label) in [(common::default_model_path(), "q4_1"), (common::q4_k_m_model_path(), "q4_k_m")] {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("split-{label}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make the shards' folder");
        let prefix = dir.join("model").display().to_string();
        let shards = kestrel_gguf::split_model(&path, &prefix, kestrel_gguf::SplitLimit::Tensors(4), false).expect("split");
        assert!(shards.len() > 60, "{label}: {} shards", shards.len());
        let prompt = common::bench_ids(7);
        let logits = |p: &Path| pollster::block_on(common::load_on(&gpu, p, CONTEXT).prompt_logits(&prompt)).expect("logits");
        let whole = logits(&path);
        assert!(whole == logits(&shards[0]), "{label}: the split model's logits differ from the whole file's");
    }
}

/// RoPE frequency factors (`rope_freqs.weight`) and linear RoPE scaling: both passes rotate by
/// the scaled angles.
#[test]
fn rope_variants_match_cpu_reference() {
    for variant in &common::ROPE_VARIANTS {
        check_file(&common::rope_variant(variant), variant.label, &[1, 7]);
    }
}

/// 40 tokens: a whole token tile of the prefill matmul and a partial one, as for the other types;
/// chunking is the same code whatever the weight type (the Q4_1 file's 200 tokens check it).
#[test]
fn requantized_models_match_cpu_reference() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    for (ty, label) in [(GgmlType::Q8_0, "Q8_0"), (GgmlType::Q4_0, "Q4_0"), (GgmlType::F16, "F16")] {
        let out = dir.join(format!("smollm2-{label}.gguf"));
        kestrel_gguf::quantize_model(&common::default_model_path(), &out, ty, &mut |_, _| {}).expect("quantize");
        check_file(&out, label, &[1, 7, 40]);
    }
}

/// Random-weight models of other architectures (`common::synthetic`): the same bound, at the
/// greedy tests' context of 1024 (past the long-factor Phi-3 model's original context of 512,
/// so that its long RoPE factors are the ones checked).
#[test]
fn synthetic_models_match_cpu_reference() {
    for model in &common::synthetic::SYNTHETIC_MODELS {
        let path = model.write();
        check_model(common::load(&path, 1024), &path, model.label, &[1, 7, 130], 1024);
    }
}

/// 2,048 tokens: 16 prefill chunks, attention over a long KV cache in many tiles (Gemma 2's
/// global layers) and with a sliding window far behind the last token (its local ones), RoPE at
/// far positions. On the small random-weight Gemma 2 (40 s here; Qwen 3's all-global layers took
/// 60 s): the default model would take about 7 minutes on lavapipe.
#[test]
fn a_long_prompt_matches_cpu_reference() {
    let model = &common::synthetic::GEMMA2_F32;
    let path = model.write();
    check_model(common::load(&path, 2056), &path, model.label, &[2048], 2056);
}
