//! Shared by the model tests: the default model, a GPU that fails loudly when missing, and
//! llama.cpp's reference outputs (tests/data/reference, copied from shared/reference).
//!
//! What a test binary needs again and again is made once per binary and shared: the device (and
//! with it the compiled pipelines), the default model's parsed file, the model files the tests
//! write. Each is immutable once made; every test still loads the models it runs, so no test
//! sees another's state.
#![allow(dead_code)]

pub mod synthetic;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use kestrel_engine::generation::{GenerateOptions, Generator};
use kestrel_gguf::GgufHeader;
use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::{LoadOptions, Model};
use serde_json::Value;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn default_model_path() -> PathBuf {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh", path.display());
    path
}

/// A device no other test is using, from the binary's pool: its pipeline cache keeps what the
/// tests that used it before compiled, so a kernel compiles about once per test thread instead
/// of once per model load, while tests running at the same time still have queues of their own
/// (lavapipe runs a queue's work in order: one shared queue would serialize them). Tests that
/// count the device's memory or break it take their own (`own_gpu`).
pub fn gpu() -> Gpu {
    static POOL: Mutex<Vec<Gpu>> = Mutex::new(Vec::new());
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    // Free when the pool holds the only handle: every test that used it has dropped its own.
    if let Some(free) = pool.iter().find(|gpu| Arc::strong_count(&gpu.info) == 1) {
        return free.clone();
    }
    let gpu = own_gpu();
    pool.push(gpu.clone());
    gpu
}

/// A device of the test's own, with the default options.
pub fn own_gpu() -> Gpu {
    gpu_with(&GpuOptions::default())
}

pub fn gpu_with(options: &GpuOptions) -> Gpu {
    Gpu::new_blocking(options)
        .unwrap_or_else(|e| panic!("no GPU adapter ({e}); install Mesa's lavapipe: apt-get install mesa-vulkan-drivers"))
}

pub fn load(path: &std::path::Path, context: usize) -> Model {
    load_on(&gpu(), path, context)
}

/// `load` on a given device.
pub fn load_on(gpu: &Gpu, path: &std::path::Path, context: usize) -> Model {
    load_with(gpu, path, LoadOptions { context_length: Some(context), ..LoadOptions::default() })
}

/// Loads with `options` on a given device.
pub fn load_with(gpu: &Gpu, path: &std::path::Path, options: LoadOptions) -> Model {
    pollster::block_on(kestrel_model::load_file(gpu, path, options, &mut |_| {})).expect("load the model")
}

/// The process's resident memory in bytes (Linux: /proc/self/statm, in pages of 4 KiB).
/// `path` on the CPU backend with a KV cache of `context` tokens.
#[allow(dead_code)]
pub fn load_cpu(path: &std::path::Path, context: usize) -> Model {
    let options = LoadOptions { context_length: Some(context), ..LoadOptions::default() };
    pollster::block_on(kestrel_model::load_file_cpu(path, options, &mut |_| {})).expect("load on the CPU backend")
}

pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("the resident page count");
    pages * 4096
}

/// Device memory in live allocations once the buffers already dropped are freed.
pub fn settled_gpu_bytes(gpu: &Gpu) -> u64 {
    gpu.device.poll(kestrel_gpu::wgpu::PollType::wait_indefinitely()).expect("poll the device");
    gpu.allocated_bytes().expect("lavapipe's Vulkan backend reports its allocations")
}

/// The default model's file, read once for the binary: its header and each tensor's bytes.
pub fn default_model_file() -> &'static (GgufHeader, Vec<Vec<u8>>) {
    static FILE: LazyLock<(GgufHeader, Vec<Vec<u8>>)> =
        LazyLock::new(|| kestrel_gguf::read_file(&default_model_path()).expect("read the default model"));
    &FILE
}

/// Values made once per binary, by key: the first test that asks for one makes it, a test that
/// asks while it is being made waits for it, and every later one gets a copy. For what is the
/// same every time it is made (a file written, a reference's logits).
pub struct Shared<T>(LazyLock<Mutex<HashMap<String, Arc<OnceLock<T>>>>>);

impl<T: Clone> Shared<T> {
    pub const fn new() -> Self {
        Self(LazyLock::new(Mutex::default))
    }

    pub fn get_or_make(&self, key: &str, make: impl FnOnce() -> T) -> T {
        // The map is locked only to find the key's cell: values of other keys are made meanwhile.
        let cell = self.0.lock().unwrap_or_else(PoisonError::into_inner).entry(key.to_string()).or_default().clone();
        cell.get_or_init(make).clone()
    }
}

/// Runs `write` for `key` once per binary and returns its path ever after: the files the tests
/// write are the same bytes every time, so the binary's other tests (and its later calls) reuse
/// the first.
pub fn write_once(key: &str, write: impl FnOnce() -> PathBuf) -> PathBuf {
    static WRITTEN: Shared<PathBuf> = Shared::new();
    WRITTEN.get_or_make(key, write)
}

/// llama.cpp's Q4_K_M of the default model, made by scripts/make-q4-k-m.sh.
pub fn q4_k_m_model_path() -> PathBuf {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_K_M.gguf");
    assert!(path.exists(), "{} is missing: run scripts/make-q4-k-m.sh", path.display());
    path
}

/// llama.cpp's greedy reference for the default model (tests/data/reference/greedy.json).
pub fn greedy_reference() -> Value {
    greedy_reference_in("reference")
}

/// llama.cpp's greedy reference in `tests/data/{dir}/greedy.json`.
pub fn greedy_reference_in(dir: &str) -> Value {
    let path = repo_root().join("tests/data").join(dir).join("greedy.json");
    serde_json::from_slice(&std::fs::read(&path).expect("read greedy.json")).expect("parse greedy.json")
}

pub fn prompts_reference() -> Value {
    let path = repo_root().join("tests/data/reference/prompts.json");
    serde_json::from_slice(&std::fs::read(&path).expect("read prompts.json")).expect("parse prompts.json")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an array of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// log-softmax in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// A RoPE variant of the default model, written by `rope_variant`, and the directory of
/// llama.cpp's greedy reference for it under tests/data.
#[derive(Clone)]
pub struct RopeVariant {
    pub label: &'static str,
    pub reference_dir: &'static str,
    /// Metadata keys to add.
    pub metadata: &'static [(&'static str, f32)],
    /// `rope_freqs.weight` values to add (one per pair of a head's 64 dimensions), if any.
    pub factors: Option<fn(usize) -> f32>,
}

/// The default model with RoPE frequency factors 0.5, 1, 1.5, 2, 0.5, ... per pair (strong
/// enough to change its greedy text, unlike Llama 3's, which barely touch short contexts), and
/// with linear RoPE scaling by 2.
pub const ROPE_VARIANTS: [RopeVariant; 2] = [
    RopeVariant { label: "rope_freqs", reference_dir: "reference-rope-freqs", metadata: &[], factors: Some(|i| 0.5 * (1 + i % 4) as f32) },
    RopeVariant {
        label: "linear x2",
        reference_dir: "reference-rope-linear",
        metadata: &[("llama.rope.scaling.factor", 2.0)],
        factors: None,
    },
];

/// Writes `variant` of the default model to the test target directory (deterministic: the same
/// bytes on every run, which tests/data/<reference_dir>/README.md's sha256 records; once per
/// binary) and returns its path.
pub fn rope_variant(variant: &RopeVariant) -> PathBuf {
    write_once(variant.reference_dir, || write_rope_variant(variant))
}

fn write_rope_variant(variant: &RopeVariant) -> PathBuf {
    use kestrel_gguf::{GgmlType, GgufWriter, MetadataValue, TensorSpec};
    let (header, tensors) = default_model_file();
    let mut metadata = header.metadata.clone();
    for (key, value) in variant.metadata {
        metadata.set(*key, MetadataValue::F32(*value));
    }
    let mut specs: Vec<TensorSpec> =
        header.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type }).collect();
    let mut data: Vec<&[u8]> = tensors.iter().map(Vec::as_slice).collect();
    let values: Vec<u8>;
    if let Some(factor) = variant.factors {
        values = (0..32).flat_map(|i| factor(i).to_le_bytes()).collect();
        specs.insert(0, TensorSpec { name: "rope_freqs.weight".into(), dims: vec![32], ggml_type: GgmlType::F32 });
        data.insert(0, &values);
    }
    let name = variant.reference_dir.trim_start_matches("reference-");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("SmolLM2-135M-Instruct.Q4_1.{name}.gguf"));
    let file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create the variant file"));
    let mut writer = GgufWriter::new(file, &metadata, &specs).expect("write the header");
    for bytes in data {
        writer.write_tensor(bytes).expect("write a tensor");
    }
    writer.finish().expect("finish the variant file");
    path
}

/// Runs the model's batched sequences to their ends, `prefill` prompt tokens a step; returns
/// each one's events (token texts, then the generation) in the order added.
pub fn run_batched(
    model: &mut Generator,
    requests: &[(Vec<u32>, GenerateOptions)],
    prefill: usize,
) -> Vec<(String, kestrel_engine::Generation)> {
    use kestrel_engine::generation::SequenceEvent;
    let ids: Vec<_> = requests.iter().map(|(prompt, options)| model.add_sequence(prompt, options).expect("add")).collect();
    let mut streamed = vec![String::new(); ids.len()];
    let mut done: Vec<Option<kestrel_engine::Generation>> = vec![None; ids.len()];
    let mut batched_decodes = 0;
    while model.running_sequences() > 0 {
        let step = pollster::block_on(model.step(prefill));
        assert!(step.sequences > 0 && step.rows >= step.sequences, "a step with sequences running ran nothing");
        if step.decoding > 1 {
            batched_decodes += 1;
        }
        for (id, event) in step.events {
            let i = ids.iter().position(|&x| x == id).expect("an event of an added sequence");
            assert!(done[i].is_none(), "an event after the sequence ended");
            match event {
                SequenceEvent::Token(t) => streamed[i].push_str(&t.text),
                SequenceEvent::Done(result) => done[i] = Some(result.expect("the sequence succeeds")),
            }
        }
    }
    assert!(batched_decodes > 0, "no step decoded several sequences together");
    assert_eq!(model.free_slots(), model.slots(), "every slot is free at the end");
    streamed.into_iter().zip(done).map(|(s, g)| (s, g.expect("every sequence ended"))).collect()
}

/// The first `n` token ids of the bench prompt (llama.cpp's tokenization of it).
pub fn bench_ids(n: usize) -> Vec<u32> {
    ids(&greedy_reference()["bench_prompt"]["ids"])[..n].to_vec()
}

/// Requests of every kind a batch mixes: greedy ones of several lengths, one with logprobs, one
/// sampled with a seed, top-k and a repetition penalty. The longest prompt has `long` tokens (at
/// least 8), the longest generation `tokens` (at least 4).
pub fn mixed_requests(long: usize, tokens: usize) -> Vec<(Vec<u32>, GenerateOptions)> {
    let prompt = bench_ids(long);
    let greedy = |max_tokens| GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::greedy() };
    let sampled = GenerateOptions {
        max_tokens: tokens - 2,
        temperature: 0.9,
        top_k: 40,
        seed: Some(11),
        repetition_penalty: 1.3,
        penalty_last_n: 32,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    vec![
        (prompt.clone(), greedy(tokens)),
        (bench_ids(5), GenerateOptions { logprobs: 3, ..greedy(tokens - 3) }),
        (bench_ids(long * 2 / 5 + 1), sampled),
        (prompt[..long / 2 + 3].to_vec(), greedy(tokens / 2)),
    ]
}

/// Each request generated alone (the cache reset before each).
pub fn generate_alone(model: &mut Generator, requests: &[(Vec<u32>, GenerateOptions)]) -> Vec<kestrel_engine::Generation> {
    requests
        .iter()
        .map(|(prompt, options)| {
            model.reset();
            pollster::block_on(model.generate(prompt, options, &mut |_| true)).expect("alone")
        })
        .collect()
}

/// Runs `requests` as batched sequences of `model` (4 slots or more), their prompts entering
/// `prefill` tokens a step interleaved with the others' decode steps, and asserts that each gives
/// what it gave `alone`; then that each slot kept its sequence's tokens (the same prompt again
/// reuses all but its last).
pub fn assert_batched_as_alone(
    model: &mut Generator,
    requests: &[(Vec<u32>, GenerateOptions)],
    alone: &[kestrel_engine::Generation],
    prefill: usize,
) {
    for ((streamed, batched), want) in run_batched(model, requests, prefill).into_iter().zip(alone) {
        assert_eq!(batched.tokens, want.tokens, "batched tokens differ from the request alone");
        assert_eq!(batched.text, want.text);
        assert_eq!(streamed, want.text, "the streamed text is the generation's");
        assert_eq!(batched.finish_reason, want.finish_reason);
        assert_eq!(batched.logprobs, want.logprobs);
    }
    let again = run_batched(model, &requests[..2], 64);
    assert_eq!(again[0].1.timings.reused_tokens, requests[0].0.len() - 1);
    assert_eq!(again[1].1.timings.reused_tokens, requests[1].0.len() - 1);
    assert_eq!(again[0].1.tokens, alone[0].tokens);
    assert_eq!(again[1].1.tokens, alone[1].tokens);
}
