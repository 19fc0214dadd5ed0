//! The will-it-fit estimate from the header alone agrees with what loading the model does: the
//! same weight bytes on the GPU, and a device one byte short of the largest binding refuses the
//! load with the same `device_limits` the estimate predicts, while one with exactly that loads.

mod common;

use kestrel_gpu::params::KvType;
use kestrel_gpu::GpuOptions;
use kestrel_model::estimate::{DeviceLimits, Estimate};
use kestrel_model::{LoadOptions, ModelError};

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
    let verdict = estimate.verdict(&short);
    assert_eq!((verdict.fits, verdict.code), (false, Some("device_limits")), "{verdict:?}");
    match load_with_binding_limit(limit - 1) {
        Err(e) => assert_eq!(e.code(), "device_limits", "{e}"),
        Ok(_) => panic!("loaded with a binding limit below the estimate's largest binding ({estimate:?})"),
    }
    let exact = DeviceLimits { max_buffer_size: u64::MAX, max_storage_buffer_binding_size: limit };
    assert!(estimate.verdict(&exact).fits);
    load_with_binding_limit(limit).unwrap_or_else(|e| panic!("the estimate says {limit} bytes fit, the load: {e}"));
}
