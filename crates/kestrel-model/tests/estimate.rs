//! The will-it-fit estimate from the header alone agrees with what loading the model does: the
//! same weight bytes on the GPU, and a device one byte short of the largest binding refuses the
//! load with the same `device_limits` the estimate predicts, while one with exactly that loads;
//! the GPU's total is what the device holds, and the CPU backend's buffers are what its estimate
//! counts. Where the CPU backend has no room, the load fails with `out_of_memory`.

mod common;

use common::synthetic::{SyntheticModel, SyntheticRope, GEMMA3_F32, GEMMA3_Q4_K, PHI3_F32, QWEN2_F32, QWEN2_Q8_0, QWEN3_F32};
use kestrel_engine::generation::{GenerateOptions, Generator};
use kestrel_gguf::GgmlType;
use kestrel_gpu::GpuOptions;
use kestrel_model::estimate::{cpu_weight_bytes, DeviceLimits, Estimate, MemoryLimit};
use kestrel_model::{LoadOptions, ModelError};
use kestrel_ops::params::KvType;

const CONTEXT: usize = 256;

fn header() -> kestrel_gguf::GgufHeader {
    let bytes = std::fs::read(common::default_model_path()).unwrap();
    kestrel_gguf::parse_header(&bytes).unwrap()
}

fn load_with_binding_limit(limit: u64) -> Result<kestrel_model::Model, ModelError> {
    let gpu = common::gpu_with(&GpuOptions { max_storage_binding: Some(limit), ..GpuOptions::default() });
    let options = LoadOptions { context_length: Some(CONTEXT), ..LoadOptions::default() };
    pollster::block_on(kestrel_model::load_file(&gpu, &common::default_model_path(), options, &mut |_| {}))
}

#[test]
fn the_estimate_matches_the_loaded_model_and_predicts_the_binding_limit() {
    let estimate = Estimate::from_header(&header(), Some(CONTEXT), KvType::default(), 1).unwrap();
    let size = std::fs::metadata(common::default_model_path()).unwrap().len();
    assert_eq!(estimate.file_bytes, size);
    assert!(estimate.unsupported.is_empty());
    let c = common::load(&common::default_model_path(), CONTEXT);
    assert_eq!(estimate.weight_bytes, c.weight_bytes(), "weights on the GPU");
    assert_eq!(estimate.kv_cache_bytes, c.kv_cache_bytes(), "the f16 KV cache's buffers");
    drop(c);
    // The CPU backend keeps an f16 cache in f16 bits too.
    let cpu = common::load_cpu(&common::default_model_path(), CONTEXT);
    assert_eq!(estimate.kv_cache_bytes, cpu.kv_cache_bytes(), "the CPU backend's f16 KV cache");
    drop(cpu);
    let f32_cache = Estimate::from_header(&header(), Some(CONTEXT), KvType::F32, 1).unwrap();
    assert_eq!(f32_cache.kv_cache_bytes, 2 * estimate.kv_cache_bytes, "an f32 cache is twice the f16 one");

    // Slots: one KV cache each, a layer's K for every slot in one binding, as the load allocates.
    let slots = Estimate::from_header(&header(), Some(CONTEXT), KvType::default(), 4).unwrap();
    let options = LoadOptions { context_length: Some(CONTEXT), slots: 4, ..LoadOptions::default() };
    let four = common::load_with(&common::gpu(), &common::default_model_path(), options);
    assert_eq!(slots.kv_cache_bytes, four.kv_cache_bytes(), "four slots' caches");
    assert_eq!(slots.kv_cache_bytes, 4 * estimate.kv_cache_bytes);
    drop(four);
    for bad in [0, kestrel_model::MAX_SLOTS + 1] {
        let error = Estimate::from_header(&header(), Some(CONTEXT), KvType::default(), bad).expect_err("slots out of range");
        assert_eq!(error.code(), "invalid_option", "{bad} slots: {error}");
    }

    let limit = estimate.largest_binding.bytes;
    let short = DeviceLimits { max_buffer_size: u64::MAX, max_storage_buffer_binding_size: limit - 1 };
    let verdict = estimate.verdict(&short, &MemoryLimit::gpu(None));
    assert_eq!((verdict.fits, verdict.code), (false, Some("device_limits")), "{verdict:?}");
    match load_with_binding_limit(limit - 1) {
        Err(e) => assert_eq!(e.code(), "device_limits", "{e}"),
        Ok(_) => panic!("loaded with a binding limit below the estimate's largest binding ({estimate:?})"),
    }
    let exact = DeviceLimits { max_buffer_size: u64::MAX, max_storage_buffer_binding_size: limit };
    assert!(estimate.verdict(&exact, &MemoryLimit::gpu(None)).fits);
    load_with_binding_limit(limit).unwrap_or_else(|e| panic!("the estimate says {limit} bytes fit, the load: {e}"));
}

/// The CPU backend holds what the estimate says: its weights, vectors and KV caches (three slots
/// here) are wasm's layout exactly where the scales are f32 (as in wasm, and natively for F32
/// matrices), and natively exactly the native layout `Matrix::stored_bytes` gives for each
/// matrix's type and shape: f16 scales for the 4-bit and 8-bit formats quantized here, Q4_0
/// interleaved without offsets, the K-quants' scales factored, Q6_K's levels in 6 bits. Models of
/// every storage: F32 matrices, Q4_0, Q4_1 in Phi-3's fused tensors (split after the load), Q8_0
/// with biases, Q4_K and Q6_K (16 weights a scale).
#[test]
fn the_cpu_estimate_is_what_the_cpu_backend_allocates() {
    // With the f32-scale layout natively too (F32 matrices).
    let models: [(SyntheticModel, bool); 6] = [
        (QWEN3_F32, true),
        (SyntheticModel { label: "qwen2 Q4_0", matrix_type: GgmlType::Q4_0, ..QWEN2_F32 }, false),
        (SyntheticModel { label: "phi3 Q4_1", matrix_type: GgmlType::Q4_1, rope: SyntheticRope::Plain, ..PHI3_F32 }, false),
        (QWEN2_Q8_0, false),
        (GEMMA3_Q4_K, false),
        (SyntheticModel { label: "gemma3 Q6_K", matrix_type: GgmlType::Q6_K, ..GEMMA3_F32 }, false),
    ];
    for (model, f32_scales) in models {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("estimate-{}.gguf", model.label.replace(' ', "-")));
        model.write_to(&path);
        let header = kestrel_gguf::parse_header(&std::fs::read(&path).unwrap()).unwrap();
        let estimate = Estimate::from_header(&header, Some(CONTEXT), KvType::F16, 3).unwrap();
        let mut loaded = common::load_cpu(&path, CONTEXT);
        loaded.set_slots(3).unwrap();
        assert_eq!(estimate.cpu.kv_cache_bytes, loaded.kv_cache_bytes(), "{}: three slots' caches", model.label);
        let held = loaded.cpu_buffer_bytes().unwrap() - loaded.kv_cache_bytes();
        let native_layout = cpu_weight_bytes(&header, true).unwrap();
        if f32_scales {
            assert_eq!(held, estimate.cpu.weight_bytes, "{}: f32 scales", model.label);
        } else {
            assert_eq!(held, native_layout, "{}: the native layout", model.label);
        }
        assert!(estimate.cpu.verdict.fits && estimate.cpu.bytes > estimate.cpu.weight_bytes + estimate.cpu.kv_cache_bytes);
    }
}

/// The GPU's total (weights, KV caches, activations) is what the device holds for the model once
/// it runs, within 1 % (the uniforms, penalty entries and readback slots it leaves out are small):
/// measured 0.2 % over the estimate. While it loads, the device holds no more than that plus
/// the staging copies of at most two pieces of uploads (`kestrel_gpu::WRITE_PIECE`): each
/// piece's is given back once it is written, where wgpu kept every upload's until the first
/// step (as much again as the weights).
#[test]
fn the_gpu_total_is_what_the_device_allocates() {
    for (context, slots) in [(CONTEXT, 1), (1024, 4)] {
        let estimate = Estimate::from_header(&header(), Some(context), KvType::default(), slots).unwrap();
        // A fresh device: nothing another test left on a pooled one is in the count.
        let gpu = common::own_gpu();
        let before = common::settled_gpu_bytes(&gpu);
        let options = LoadOptions { context_length: Some(context), slots, ..LoadOptions::default() };
        let mut peak = 0u64;
        let mut sample = |_: &kestrel_model::LoadProgress| peak = peak.max(gpu.allocated_bytes().expect("an allocator report"));
        let mut model = Generator::new(
            pollster::block_on(kestrel_model::load_file(&gpu, &common::default_model_path(), options, &mut sample)).expect("load"),
        );
        let bound = estimate.total_bytes + 2 * kestrel_gpu::WRITE_PIECE as u64;
        assert!(peak - before <= bound, "{context} tokens x {slots} slots: {} bytes while loading, over {bound}", peak - before);
        let one_token = GenerateOptions { max_tokens: 1, ..GenerateOptions::greedy() };
        let generation = pollster::block_on(model.generate(&[1, 2, 3], &one_token, &mut |_| true)).unwrap();
        assert_eq!(generation.tokens.len(), 1);
        let allocated = common::settled_gpu_bytes(&gpu) - before;
        let off = allocated.abs_diff(estimate.total_bytes) as f64 / estimate.total_bytes as f64;
        assert!(off <= 0.01, "{context} tokens x {slots} slots: the device holds {allocated} bytes, the estimate {}", estimate.total_bytes);
    }
}

/// A model the CPU backend has no room for fails to load with `out_of_memory` rather than
/// aborting the process (in the browser: a wasm trap that leaves the engine unusable), and the
/// next load works: KV caches of 2^40 positions (384 TiB a layer, past any address space) and of
/// a length that overflows a usize.
#[test]
fn no_room_on_the_cpu_backend_is_out_of_memory_and_the_next_load_works() {
    for context in [1usize << 40, usize::MAX / 2] {
        let options = LoadOptions { context_length: Some(context), ..LoadOptions::default() };
        match pollster::block_on(kestrel_model::load_file_cpu(&common::default_model_path(), options, &mut |_| {})) {
            Err(e) => assert_eq!(e.code(), "out_of_memory", "{context} positions: {e}"),
            Ok(_) => panic!("a KV cache of {context} positions loaded"),
        }
    }
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), CONTEXT));
    let generation =
        pollster::block_on(model.generate(&[1, 2, 3], &GenerateOptions { max_tokens: 2, ..GenerateOptions::greedy() }, &mut |_| true));
    assert_eq!(generation.expect("generate after the failed loads").tokens.len(), 2);
}
