//! Loading and unloading a model again and again gives its memory back: the device's allocations
//! (wgpu's allocator report) and the process's resident memory return to their baseline.
//!
//! `KESTREL_LEAK_CYCLES` sets the number of cycles (default 10, CI's smoke); `./build.sh soak`
//! runs 100.

mod common;

use kestrel_engine::generation::{GenerateOptions, Generator, Prompt};
use kestrel_model::{LoadOptions, ModelLoader};

/// Loads the model from `bytes`, generates a few tokens and drops it.
fn cycle(gpu: &kestrel_gpu::Gpu, bytes: &[u8]) {
    let mut loader = ModelLoader::new(gpu, LoadOptions { context_length: Some(256), ..LoadOptions::default() });
    for chunk in bytes.chunks(1 << 20) {
        loader.push(chunk).expect("push a chunk");
    }
    let mut model = Generator::new(pollster::block_on(loader.finish()).expect("load"));
    let prompt = model.encode(&Prompt::Text("river stone")).expect("encode");
    let options = GenerateOptions { max_tokens: 4, ignore_eos: true, ..GenerateOptions::greedy() };
    let generation = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("generate");
    assert_eq!(generation.tokens.len(), 4);
}

#[test]
fn load_unload_cycles_return_gpu_and_process_memory() {
    let cycles: usize = std::env::var("KESTREL_LEAK_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let bytes = std::fs::read(common::synthetic::QWEN3_F32.write()).expect("read the synthetic model");
    // A fresh device: "empty" is a device no other test has used.
    let gpu = common::own_gpu();
    let empty = common::settled_gpu_bytes(&gpu);
    // Two cycles first: the pipelines compiled and the allocators' pools grown once.
    for _ in 0..2 {
        cycle(&gpu, &bytes);
    }
    let (rss_base, gpu_base) = (common::resident_bytes(), common::settled_gpu_bytes(&gpu));
    for _ in 0..cycles {
        cycle(&gpu, &bytes);
    }
    let (rss_end, gpu_end) = (common::resident_bytes(), common::settled_gpu_bytes(&gpu));
    println!(
        "leaks: {cycles} load/unload cycles of a {} KiB model: GPU memory {empty} B before any load, {gpu_base} B after warm-up, \
         {gpu_end} B after; process memory {} MiB after warm-up, {} MiB after",
        bytes.len() >> 10,
        rss_base >> 20,
        rss_end >> 20
    );
    // An unloaded model holds no device memory: back to the empty device's figure, give or take
    // wgpu's staging buffers for queue writes (a few KiB each, created and freed as writes land).
    let staging = 64 << 10;
    assert!(gpu_base.abs_diff(empty) <= staging, "GPU memory {gpu_base} B after warm-up, {empty} B empty");
    assert!(gpu_end.abs_diff(empty) <= staging, "GPU memory {gpu_end} B after {cycles} cycles, {empty} B empty");
    // Each cycle holds the whole model on the host while it streams in: a leaked copy of it, or
    // of any large part, in any cycle would exceed 16 MiB.
    assert!(rss_end <= rss_base + (16 << 20), "process memory grew from {rss_base} to {rss_end} bytes over {cycles} cycles");
}
