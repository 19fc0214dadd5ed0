//! Will a model fit, before its weights are fetched: from the GGUF header alone, the bytes its
//! weights take on the GPU, its KV cache at a context length, the GPU's activation buffers and
//! the total of the three, the largest buffer one binding must hold, the tensors of a type the
//! GPU cannot run, and what the CPU backend needs. Then the verdicts: against a device's limits
//! and the memory it can plausibly hold (`verdict`), and for the CPU backend against 32-bit wasm
//! memory (`Estimate::cpu`), with a draft model of speculative decoding where one loads beside it
//! (`Estimate::add_draft`). The browser package asks this before a download (`estimate()`, and
//! `createEngine` first, which picks the backend from the two verdicts).

use kestrel_cpu::Matrix;
use kestrel_gguf::{GgufHeader, TensorInfo};
use kestrel_gpu::kernels::attention::DECODE_CHUNK;
use kestrel_gpu::layout::{gpu_sections, is_gpu_supported};
use kestrel_ops::params::KvType;
use serde::Serialize;

use crate::config::ModelConfig;
use crate::encoder::{self, EncoderConfig};
use crate::load::context_length;
use crate::model::MAX_SLOTS;
use crate::tensors::{assign_roles, gpu_runs, Expected, Role};
use crate::LoadOptions;
use crate::ModelError;

const GIB: u64 = 1 << 30;

/// All the memory a 32-bit wasm instance can grow to: 65536 pages of 64 KiB.
pub const WASM32_MEMORY_BYTES: u64 = 4 * GIB;

/// What the engine takes of wasm memory besides the model's buffers and its tokenizer: its static
/// data, stack and allocator, the stream's chunks as they are copied in. Measured in Chromium
/// (tests/browser/estimate.test.mjs), the 135M model on the CPU backend took 133.6 MB of wasm
/// memory after a load and a generation: the estimate's weights, KV cache and step buffers (of a
/// whole prompt chunk) and 2.5 MB more, the tokenizer of its 1.8 MB header included. These
/// constants keep a margin over that (the estimate came to 155 MB).
const ENGINE_BASE_BYTES: u64 = 16 << 20;

/// The tokenizer and the parsed metadata, per byte of the GGUF header that holds them
/// (vocabulary, merges, chat template): the strings again in the tokenizer's maps, each with its
/// allocation's overhead.
const ENGINE_BYTES_PER_HEADER_BYTE: u64 = 4;

/// Chrome's largest `navigator.deviceMemory`: it reports 8 for 8 GiB or more.
const DEVICE_MEMORY_CAP_GIB: f64 = 8.0;

/// What a GPU is taken to hold where the browser gives no usable number: WebGPU reports no
/// memory size at all, and `navigator.deviceMemory` stops at 8 GiB. 16 GiB is the VRAM of
/// today's high-end consumer GPUs, so a model above it is refused only where few GPUs hold it.
const DEFAULT_GPU_MEMORY_BYTES: u64 = 16 * GIB;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    pub name: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnsupportedTensor {
    pub tensor: String,
    #[serde(rename = "type")]
    pub ty: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// "chat", "embedding" (an encoder, or a decoder with a pooling type) or "reranker" (an
    /// encoder with rank pooling).
    pub kind: &'static str,
    /// Why an engine with a GPU would run this model on the CPU backend (an encoder the GPU
    /// encoder cannot take); then the GPU verdict is the CPU backend's. None: a GPU engine runs
    /// it on the GPU, as the fields below size it (an encoder's layers: the embedding table, its
    /// norm and the rank head stay on the host).
    pub cpu_only: Option<String>,
    pub name: String,
    pub arch: String,
    /// The file's size (where its last tensor ends).
    pub file_bytes: u64,
    /// The weights as packed on the GPU (supported tensors only); where `cpu_only` is set, as the
    /// CPU backend stores them.
    pub weight_bytes: u64,
    pub context_length: usize,
    /// Sequences that can generate at once, each with its own KV cache.
    pub slots: usize,
    /// K and V of every layer at `context_length` for every slot, in the cache's value type.
    pub kv_cache_bytes: u64,
    /// The GPU's other buffers: a prefill chunk's activations, the logits (every slot's, with
    /// their readback copies) and the decode attention's partial results.
    pub activation_bytes: u64,
    /// Weights + KV cache + activations: what the GPU must hold at once.
    pub total_bytes: u64,
    /// The largest buffer one binding must hold: a weight matrix (Q, K and V of a layer fused
    /// when they share a type), a layer's K or V cache, a prefill chunk's activations, or the
    /// logits.
    pub largest_binding: Binding,
    pub unsupported: Vec<UnsupportedTensor>,
    /// What the CPU backend needs in wasm memory, and whether that fits.
    pub cpu: CpuEstimate,
}

/// The CPU backend's memory in 32-bit wasm, where the browser runs it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuEstimate {
    /// Weights + KV cache + scratch + the engine's own: the wasm memory the load and generation
    /// reach.
    pub bytes: u64,
    /// The weights as `kestrel_cpu::Matrix` stores them in wasm (scales in f32; natively at most
    /// this, as scales that are exactly f16 are kept so) and the norm and bias vectors in f32.
    pub weight_bytes: u64,
    /// Every slot's KV cache (f16 values kept as f16 bits, as on the GPU).
    pub kv_cache_bytes: u64,
    /// What the peak holds beyond the weights and the KV cache: a step's buffers (a prefill
    /// chunk's activations and attention scores, the logits), or where the load goes higher, a
    /// tensor's bytes buffered until they are complete (before the KV cache is allocated), or the
    /// part split off a file's fused matrix.
    pub scratch_bytes: u64,
    /// The engine itself: its data and stack, and the tokenizer and metadata from the header.
    pub engine_bytes: u64,
    /// A draft model's weights, KV cache, scratch, tokenizer and metadata (`Estimate::add_draft`;
    /// 0 without one).
    pub draft_bytes: u64,
    pub memory_limit: MemoryLimit,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What the device allows (WebGPU's adapter limits of the same names).
#[derive(Clone, Copy, Debug)]
pub struct DeviceLimits {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
}

/// The memory a model's buffers must fit in, and where that number comes from: 'device_memory'
/// (the host memory the browser reports), 'default' (`DEFAULT_GPU_MEMORY_BYTES`, where the
/// browser reports none below its cap) or 'wasm32' (all 32-bit wasm memory can grow to).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: &'static str,
}

impl MemoryLimit {
    /// What a GPU can plausibly hold, WebGPU giving no memory size: the host memory the browser
    /// reports (`navigator.deviceMemory`, in GiB), where that is below Chrome's cap of 8 (a
    /// machine with little memory has a GPU with little, or shares it); 16 GiB where the report
    /// is the cap ("8 or more") or absent; the report where a browser gives more than both.
    pub fn gpu(device_memory_gib: Option<f64>) -> Self {
        let reported = device_memory_gib.filter(|g| g.is_finite() && *g > 0.0);
        match reported {
            Some(g) if g < DEVICE_MEMORY_CAP_GIB || g * GIB as f64 > DEFAULT_GPU_MEMORY_BYTES as f64 => {
                Self { bytes: (g * GIB as f64) as u64, source: "device_memory" }
            }
            _ => Self { bytes: DEFAULT_GPU_MEMORY_BYTES, source: "default" },
        }
    }

    /// The CPU backend's: 32-bit wasm memory.
    pub fn wasm32() -> Self {
        Self { bytes: WASM32_MEMORY_BYTES, source: "wasm32" }
    }

    /// The limit in words, for a reason.
    fn describe(&self) -> String {
        let amount = format!("{} bytes ({})", self.bytes, gib(self.bytes));
        match self.source {
            "device_memory" => format!("the {amount} of memory this device reports (navigator.deviceMemory)"),
            "wasm32" => format!("the {amount} that 32-bit wasm memory can grow to"),
            _ => format!(
                "the {amount} taken as what a GPU can hold (WebGPU reports no memory size, and navigator.deviceMemory none below \
                 its cap of 8 GiB)"
            ),
        }
    }
}

/// Whether the model fits, and if not, the error code and reason loading would fail with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub fits: bool,
    pub code: Option<&'static str>,
    pub reason: Option<String>,
}

impl Verdict {
    const FITS: Verdict = Verdict { fits: true, code: None, reason: None };

    fn no(code: &'static str, reason: String) -> Self {
        Self { fits: false, code: Some(code), reason: Some(reason) }
    }
}

impl Estimate {
    /// Sizes the model described by `header` with `slots` KV caches (`LoadOptions::slots`) of
    /// `context_length` tokens (None: the default a load takes) of `kv` values. An architecture,
    /// shape or slot count Kestrel refuses is the same error the load gives.
    pub fn from_header(header: &GgufHeader, context: Option<usize>, kv: KvType, slots: usize) -> Result<Self, ModelError> {
        if let Some(c) = EncoderConfig::from_header(header)? {
            return encoder_estimate(header, &c);
        }
        let c = ModelConfig::from_header(header)?;
        // A decoder embedding model is the chat graph with one KV cache (on either backend).
        let embedding = encoder::decoder_pooling(header)?.is_some();
        let slots = if embedding { 1 } else { slots };
        let context = context_length(&c, context)?;
        // The load's bound: a prefill chunk holds a token of every slot.
        let chunk = LoadOptions::default().max_chunk.min(context);
        if slots == 0 || slots > chunk.min(MAX_SLOTS) {
            return Err(ModelError::InvalidOption { name: "slots", reason: format!("{slots}: 1 to {}", chunk.min(MAX_SLOTS)) });
        }
        let mut weight_bytes = 0u64;
        let mut unsupported = Vec::new();
        let mut largest = Binding { name: "logits".into(), bytes: 4 * c.vocab as u64 };
        let mut consider = |name: &str, bytes: u64| {
            if bytes > largest.bytes {
                largest = Binding { name: name.to_string(), bytes };
            }
        };
        // Logits of several rows: a batched step's, a speculative verification's.
        consider("batch_logits", product(&[slots, c.vocab, 4]));
        consider("verify_logits", product(&[crate::graph::MAX_VERIFY_ROWS.min(chunk), c.vocab, 4]));
        let roles = assign_roles(header, &c)?;
        let used = used_tensors(header, &roles);
        for &(t, e) in &used {
            if !gpu_runs(e, t) {
                unsupported.push(UnsupportedTensor { tensor: t.name.clone(), ty: t.ggml_type.to_string() });
                continue;
            }
            // Vectors (norms, biases) are uploaded as f32; matrices repacked.
            let bytes = if e.rows == 1 { 4 * t.n_elements() } else { packed_bytes(t, rows(t))? };
            weight_bytes += bytes;
            // The vocabulary tables are loaded as row shards: no binding holds them whole.
            if !matches!(e.role, Role::TokenEmbedding | Role::Output) {
                consider(&t.name, bytes);
            }
        }
        // Q, K and V of a layer that share a type are uploaded as one matrix.
        for l in 0..c.n_layers {
            let find = |want: Role| used.iter().find(|&&(_, e)| e.role == want).map(|&(t, _)| t);
            if let (Some(q), Some(k), Some(v)) = (find(Role::Q(l)), find(Role::K(l)), find(Role::V(l))) {
                if q.ggml_type == k.ggml_type && k.ggml_type == v.ggml_type && is_gpu_supported(q.ggml_type) {
                    consider(&format!("blk.{l}.attn_qkv (fused)"), packed_bytes(q, rows(q) + rows(k) + rows(v))?);
                }
            }
        }
        // One buffer holds a layer's K (or V) for every slot. In u64: on wasm32 the header's head
        // counts and the page's context length could wrap a usize product into a small size that
        // "fits".
        let kv_layer = product(&[c.n_kv_heads, slots, context, c.head_dim, kv.bytes()]);
        consider(&format!("one layer's K cache ({})", plural(slots, "slot")), kv_layer);
        // The activations hold a whole prefill chunk.
        let widest = [("ffn", c.ffn), ("qkv", c.qkv_width()), ("hidden", c.hidden)].into_iter().max_by_key(|&(_, w)| w);
        if let Some((name, width)) = widest {
            consider(&format!("the {name} activations of a {chunk}-token chunk"), product(&[4, chunk, width]));
        }
        let kv_cache_bytes = kv_layer.saturating_mul(2 * c.n_layers as u64);
        let activation_bytes = gpu_activation_bytes(&c, chunk, context, slots);
        let cpu = CpuEstimate::new(header, &c, &roles, CpuSizes { context, chunk, slots, kv_cache_bytes }, &unsupported);
        Ok(Self {
            kind: if embedding { "embedding" } else { "chat" },
            cpu_only: None,
            name: c.name.clone(),
            arch: format!("{:?}", c.arch).to_lowercase(),
            file_bytes: header.data_end(),
            weight_bytes,
            context_length: context,
            slots,
            kv_cache_bytes,
            activation_bytes,
            total_bytes: weight_bytes.saturating_add(kv_cache_bytes).saturating_add(activation_bytes),
            largest_binding: largest,
            unsupported,
            cpu,
        })
    }

    /// Whether a device with `limits` that holds at most `memory` can load it: every tensor of a
    /// type the GPU runs, no binding over the limits, and the total within `memory`.
    pub fn verdict(&self, limits: &DeviceLimits, memory: &MemoryLimit) -> Verdict {
        if self.cpu_only.is_some() {
            return self.cpu.verdict.clone();
        }
        if let Some(t) = self.unsupported.first() {
            let reason = format!("tensor {:?} has type {}, which Kestrel cannot run on the GPU", t.tensor, t.ty);
            return Verdict::no("unsupported_quant", reason);
        }
        let limit = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if self.largest_binding.bytes > limit {
            let b = &self.largest_binding;
            let reason = format!("{} needs a {}-byte buffer; this device binds at most {limit} bytes", b.name, b.bytes);
            return Verdict::no("device_limits", reason);
        }
        if self.total_bytes > memory.bytes {
            let reason = format!(
                "the model needs {} bytes ({}) on the GPU, weights {} + KV cache {} ({} x {} tokens) + activations {}: more than {}",
                self.total_bytes,
                gib(self.total_bytes),
                self.weight_bytes,
                self.kv_cache_bytes,
                plural(self.slots, "slot"),
                self.context_length,
                self.activation_bytes,
                memory.describe()
            );
            return Verdict::no("device_limits", reason);
        }
        Verdict::FITS
    }

    /// Counts `draft`, a draft model of speculative decoding sized for this model's context and
    /// slots (`from_header` with this estimate's `context_length` and `slots`: its KV slots follow
    /// the model's sequences), in the CPU backend's memory and verdict. The page runs a draft
    /// model on the CPU backend whichever backend verifies, so the GPU's needs stay the model's. The engine's own base is
    /// counted once; the draft's tokenizer and metadata are its own. A draft that generates
    /// nothing (an embedding model) is `invalid_option`, as its load would be.
    pub fn add_draft(&mut self, draft: &Estimate) -> Result<(), ModelError> {
        if draft.kind != "chat" {
            let what = if draft.kind == "reranker" { "a reranker" } else { "an embedding model" };
            let reason = format!("it is {what}; a draft model generates text with the model's vocabulary");
            return Err(ModelError::InvalidOption { name: "draft_model", reason });
        }
        self.cpu.draft_bytes = draft.cpu.bytes.saturating_sub(ENGINE_BASE_BYTES);
        let unsupported = match (self.unsupported.first(), draft.unsupported.first()) {
            (Some(t), _) => Some(("tensor", t)),
            (None, Some(t)) => Some(("the draft model's tensor", t)),
            (None, None) => None,
        };
        self.cpu.judge(self.context_length, self.slots, unsupported);
        Ok(())
    }
}

/// What the CPU estimate is sized for.
struct CpuSizes {
    context: usize,
    chunk: usize,
    slots: usize,
    kv_cache_bytes: u64,
}

impl CpuEstimate {
    /// `roles`: each tensor's of the header, None for those the model does not use.
    fn new(header: &GgufHeader, c: &ModelConfig, roles: &[Option<Expected>], sizes: CpuSizes, unsupported: &[UnsupportedTensor]) -> Self {
        let CpuSizes { context, chunk, slots, kv_cache_bytes } = sizes;
        let weight_bytes = used_cpu_weight_bytes(&used_tensors(header, roles), false);
        // The peak: the highest of the load's, as each tensor arrives in file order (every one
        // waits in a buffer until its bytes are complete, the ones the model uses converted
        // beside it, after the weights converted before it); the split of a file's fused matrix
        // after the load (its later rows copied out); and a step's, once the KV caches are
        // allocated. Freed buffers are taken as reused, which the allocator does for the ones
        // that follow. (An allocation over 2 GiB, which 32-bit wasm cannot make, comes only with a
        // model far over its 4 GiB, which this refuses.)
        let mut converted = 0u64;
        let mut peak = 0u64;
        for i in header.data_order() {
            let (Some(t), role) = (header.tensors.get(i), roles.get(i).and_then(Option::as_ref)) else { continue };
            let stored = role.map_or(0, |e| cpu_tensor_bytes(t, e, false));
            converted = converted.saturating_add(stored);
            peak = peak.max(converted.saturating_add(t.n_bytes()));
            if role.is_some_and(|e| matches!(e.role, Role::Qkv(_) | Role::GateUp(_))) {
                peak = peak.max(weight_bytes.saturating_add(stored));
            }
        }
        let step = weight_bytes.saturating_add(kv_cache_bytes).saturating_add(cpu_step_bytes(c, chunk, context, slots));
        let scratch_bytes = peak.max(step).saturating_sub(weight_bytes.saturating_add(kv_cache_bytes));
        Self::from_parts(header, weight_bytes, scratch_bytes, CpuSizes { context, chunk, slots, kv_cache_bytes }, unsupported)
    }

    /// The total of the parts and its verdict against 32-bit wasm memory.
    fn from_parts(header: &GgufHeader, weight_bytes: u64, scratch_bytes: u64, sizes: CpuSizes, unsupported: &[UnsupportedTensor]) -> Self {
        let CpuSizes { context, slots, kv_cache_bytes, .. } = sizes;
        let engine_bytes = ENGINE_BASE_BYTES.saturating_add(header.data_start.saturating_mul(ENGINE_BYTES_PER_HEADER_BYTE));
        let mut cpu = Self {
            bytes: 0,
            weight_bytes,
            kv_cache_bytes,
            scratch_bytes,
            engine_bytes,
            draft_bytes: 0,
            memory_limit: MemoryLimit::wasm32(),
            verdict: Verdict::FITS,
        };
        cpu.judge(context, slots, unsupported.first().map(|t| ("tensor", t)));
        cpu
    }

    /// Totals the parts into `bytes` and judges them against 32-bit wasm memory. `unsupported`:
    /// the first tensor of a type Kestrel cannot run, with how the reason names it.
    fn judge(&mut self, context: usize, slots: usize, unsupported: Option<(&str, &UnsupportedTensor)>) {
        let Self { weight_bytes, kv_cache_bytes, scratch_bytes, engine_bytes, draft_bytes, .. } = *self;
        self.bytes = [kv_cache_bytes, scratch_bytes, engine_bytes, draft_bytes].into_iter().fold(weight_bytes, u64::saturating_add);
        self.verdict = if let Some((what, t)) = unsupported {
            Verdict::no("unsupported_quant", format!("{what} {:?} has type {}, which Kestrel cannot run", t.tensor, t.ty))
        } else if self.bytes > self.memory_limit.bytes {
            let draft = if draft_bytes > 0 { format!(" + the draft model {draft_bytes}") } else { String::new() };
            let reason = format!(
                "the CPU backend needs {} bytes ({}) of wasm memory, weights {weight_bytes} + KV cache {kv_cache_bytes} ({} x {context} \
                 tokens) + scratch {scratch_bytes} + the engine {engine_bytes}{draft}: more than {}",
                self.bytes,
                gib(self.bytes),
                plural(slots, "slot"),
                self.memory_limit.describe()
            );
            Verdict::no("device_limits", reason)
        } else {
            Verdict::FITS
        };
    }
}

/// An embedding model's estimate. The CPU backend's (`cpu`): the weights, a pass's activations
/// (`encoder::TOKENS_PER_PASS` tokens) or, where the load goes higher, the largest tensor buffered
/// until its bytes are complete, and the engine's own; no KV cache. On a GPU that runs its layers
/// (`cpu_only` None), the GPU's: the layers' matrices packed and their vectors in f32, and one
/// pass's buffers (`gpu_pass_bytes`).
fn encoder_estimate(header: &GgufHeader, c: &EncoderConfig) -> Result<Estimate, ModelError> {
    let expected = encoder::expected_tensors(c, header);
    let mut cpu_weight_bytes = 0u64;
    let mut gpu_weight_bytes = 0u64;
    let mut largest_tensor = 0u64;
    let mut largest = Binding { name: String::new(), bytes: 0 };
    let mut unsupported = Vec::new();
    let cpu_only = encoder::gpu_declines(c, header, &expected);
    for t in &header.tensors {
        let Some(e) = expected.get(&t.name) else { continue };
        largest_tensor = largest_tensor.max(t.n_bytes());
        let bytes = match e.kind {
            encoder::Kind::Values => Some(t.n_elements().saturating_mul(4)),
            encoder::Kind::Matrix => {
                let cols = t.dims.first().copied().unwrap_or(0).max(1);
                Matrix::stored_bytes(t.ggml_type, t.n_elements() / cols, cols, false)
            }
        };
        match bytes {
            Some(b) => cpu_weight_bytes = cpu_weight_bytes.saturating_add(b),
            None => unsupported.push(UnsupportedTensor { tensor: t.name.clone(), ty: t.ggml_type.to_string() }),
        }
        // nomic-bert's up bias is never uploaded: its SwiGLU has none (`encoder/gpu.rs`).
        let unused_on_gpu = c.arch == encoder::EncoderArch::NomicBert && t.name.ends_with("ffn_up.bias");
        if cpu_only.is_none() && t.name.starts_with("blk.") && !unused_on_gpu {
            let bytes = if encoder::on_gpu(&t.name, e) { packed_bytes(t, rows(t))? } else { t.n_elements().saturating_mul(4) };
            gpu_weight_bytes = gpu_weight_bytes.saturating_add(bytes);
            if bytes > largest.bytes {
                largest = Binding { name: t.name.clone(), bytes };
            }
        }
    }
    // A pass holds the hidden state, Q, K, V, the attention's output and two residual copies,
    // and the FFN's up (and gate) product.
    let pass = product(&[encoder::TOKENS_PER_PASS, 4, 7 * c.hidden + 2 * c.ffn]);
    let scratch_bytes = pass.max(largest_tensor);
    let sizes = CpuSizes { context: c.train_context, chunk: encoder::TOKENS_PER_PASS, slots: 1, kv_cache_bytes: 0 };
    let cpu = CpuEstimate::from_parts(header, cpu_weight_bytes, scratch_bytes, sizes, &unsupported);
    let (weight_bytes, activation_bytes, largest_binding) = match &cpu_only {
        Some(why) => (cpu_weight_bytes, 0, Binding { name: format!("none: it runs on the CPU backend ({why})"), bytes: 0 }),
        None => {
            let (activations, widest) = gpu_pass_bytes(c);
            if widest.bytes > largest.bytes {
                largest = widest;
            }
            (gpu_weight_bytes, activations, largest)
        }
    };
    let total_bytes = if cpu_only.is_some() { cpu.bytes } else { weight_bytes.saturating_add(activation_bytes) };
    Ok(Estimate {
        kind: encoder::kind(c.pooling),
        cpu_only,
        name: c.name.clone(),
        arch: c.arch.name().to_string(),
        file_bytes: header.data_end(),
        weight_bytes,
        context_length: c.train_context,
        slots: 1,
        kv_cache_bytes: 0,
        activation_bytes,
        total_bytes,
        largest_binding,
        unsupported,
        cpu,
    })
}

/// The GPU encoder's buffers for its largest pass (`TOKENS_PER_PASS` tokens, or one input of the
/// whole context where that is longer), and the widest of them: the hidden state and its
/// LayerNorm copy, the fused Q|K|V rows, the attention's output, the FFN product, each token's
/// span and the readback copy; and nomic-bert's RoPE table (a cos and sin per position and pair).
fn gpu_pass_bytes(c: &EncoderConfig) -> (u64, Binding) {
    let n = encoder::TOKENS_PER_PASS.max(c.train_context);
    let per_token = sum(&[&[4, c.hidden], &[3, c.hidden], &[c.ffn], &[2]]);
    let rope = if c.arch == encoder::EncoderArch::NomicBert { product(&[c.train_context, c.head_dim, 4]) } else { 0 };
    let total = per_token.saturating_mul(n as u64).saturating_mul(4).saturating_add(rope);
    let (name, width) = if c.ffn > 3 * c.hidden { ("ffn", c.ffn) } else { ("qkv", 3 * c.hidden) };
    (total, Binding { name: format!("the {name} activations of a {n}-token pass"), bytes: product(&[4, n, width]) })
}

/// The bytes the CPU backend's weights take: the matrices as `kestrel_cpu::Matrix` stores them,
/// with scales in f16 where `f16_scales` (natively, where they are exactly f16) or f32 (in wasm),
/// and the vectors in f32. Tensors of a type it cannot run count nothing.
pub fn cpu_weight_bytes(header: &GgufHeader, f16_scales: bool) -> Result<u64, ModelError> {
    let c = ModelConfig::from_header(header)?;
    let roles = assign_roles(header, &c)?;
    Ok(used_cpu_weight_bytes(&used_tensors(header, &roles), f16_scales))
}

/// The tensors the model uses, with their roles; the file's other tensors are never loaded.
fn used_tensors<'a>(header: &'a GgufHeader, roles: &'a [Option<Expected>]) -> Vec<(&'a TensorInfo, &'a Expected)> {
    header.tensors.iter().zip(roles).filter_map(|(t, e)| e.as_ref().map(|e| (t, e))).collect()
}

fn used_cpu_weight_bytes(used: &[(&TensorInfo, &Expected)], f16_scales: bool) -> u64 {
    used.iter().map(|&(t, e)| cpu_tensor_bytes(t, e, f16_scales)).fold(0, u64::saturating_add)
}

/// One tensor on the CPU backend: a vector dequantized to f32, a matrix as `Matrix` stores it.
fn cpu_tensor_bytes(t: &TensorInfo, e: &Expected, f16_scales: bool) -> u64 {
    if e.rows == 1 {
        t.n_elements().saturating_mul(4)
    } else {
        Matrix::stored_bytes(t.ggml_type, e.rows as u64, e.cols as u64, f16_scales).unwrap_or(0)
    }
}

/// The GPU's activation buffers (`Graph::new`): a chunk's token ids, rows, hidden state (and its
/// normed copy), Q|K|V, Q, attention output and FFN product; the last row's norm; the logits and
/// every slot's (each with a readback copy) and each slot sampler's, and a speculative
/// verification's rows (with their readback copy); and each layer's decode attention partials,
/// one set for one query and one for a batch of every slot.
fn gpu_activation_bytes(c: &ModelConfig, chunk: usize, context: usize, slots: usize) -> u64 {
    let per_token = sum(&[&[2, c.hidden], &[c.qkv_width()], &[2, c.q_width()], &[c.ffn]]);
    let vocab_rows = 2 + 3 * slots + 2 * crate::graph::MAX_VERIFY_ROWS.min(chunk);
    let floats = per_token.saturating_mul(chunk as u64).saturating_add(c.hidden as u64).saturating_add(product(&[vocab_rows, c.vocab]));
    let ids_and_rows = product(&[chunk, 4 + 8]);
    let queries = 1 + if slots > 1 { slots } else { 0 };
    let chunks = context.div_ceil(DECODE_CHUNK as usize);
    let partials = product(&[c.n_layers, queries, c.n_heads, chunks, 2 + c.head_dim, 4]);
    floats.saturating_mul(4).saturating_add(ids_and_rows).saturating_add(partials)
}

/// What a CPU step allocates at its peak (`CpuForward::run_batch`), for a step of a prefill chunk
/// and a decoding token of every slot: the hidden state, its norms and the layer's outputs (each
/// built in a row-major buffer, then transposed), Q, K and V with their normed and rotated
/// copies, gate, up and their product; the attention's partial results, a set per 512 keys; and
/// the logits of every slot, with the sampler's copies.
fn cpu_step_bytes(c: &ModelConfig, chunk: usize, context: usize, slots: usize) -> u64 {
    let rows = (chunk + slots) as u64;
    let per_row = sum(&[&[6, c.hidden], &[3, c.qkv_width()], &[4, c.ffn]]);
    let attention = product(&[chunk.next_multiple_of(4), c.n_heads, context.div_ceil(512), 2 + c.head_dim]);
    let logits = product(&[3 * slots + 2, c.vocab]);
    per_row.saturating_mul(rows).saturating_add(attention).saturating_add(logits).saturating_mul(4)
}

/// The product in u64, saturating: the factors come from the header and the page's options.
fn product(factors: &[usize]) -> u64 {
    factors.iter().fold(1u64, |a, &b| a.saturating_mul(b as u64))
}

/// The sum of products, likewise.
fn sum(terms: &[&[usize]]) -> u64 {
    terms.iter().map(|t| product(t)).fold(0, u64::saturating_add)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Rows of a matrix (ggml's `dims[0]` is the row length).
fn rows(t: &TensorInfo) -> u64 {
    t.dims.iter().skip(1).product()
}

fn packed_bytes(t: &TensorInfo, rows: u64) -> Result<u64, ModelError> {
    let cols = t.dims.first().copied().unwrap_or(1);
    Ok(4 * gpu_sections(t.ggml_type, rows, cols)?.total())
}

#[cfg(test)]
mod tests {
    use kestrel_gguf::GgufStreamReader;

    use super::*;
    use crate::error::bad_model;
    use crate::synthetic::synthetic_shape;

    /// The default model's header (SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions).
    fn default_header() -> GgufHeader {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e} (run scripts/fetch-model.sh)"));
        kestrel_gguf::parse_header(&bytes).unwrap()
    }

    /// The header of a synthetic model of real shapes (`synthetic.rs`), without its weights: the
    /// generator is stopped once the header has streamed past.
    fn synthetic_header(shape: &str) -> GgufHeader {
        let shape = synthetic_shape(shape).unwrap();
        let mut reader = GgufStreamReader::new();
        let _ = shape.generate(0, &mut |chunk| {
            reader.push(chunk, &mut |_| Ok(()))?;
            if reader.header().is_some() {
                return Err(bad_model("the header is all the test reads"));
            }
            Ok(())
        });
        reader.header().cloned().unwrap()
    }

    /// A WebGPU adapter with 1 GiB buffer limits (SwiftShader's, lavapipe's).
    const GIB_BUFFERS: DeviceLimits = DeviceLimits { max_buffer_size: GIB, max_storage_buffer_binding_size: GIB };

    #[test]
    fn a_kv_cache_past_what_the_gpu_can_hold_does_not_fit() {
        // Issue 41's case: 16 slots of 32768 f32 positions, no layer's buffer over 1 GiB.
        let e = Estimate::from_header(&default_header(), Some(32768), KvType::F32, 16).unwrap();
        assert_eq!(e.kv_cache_bytes, 24_159_191_040);
        assert!(e.largest_binding.bytes <= GIB, "{:?}", e.largest_binding);
        assert_eq!(e.total_bytes, e.weight_bytes + e.kv_cache_bytes + e.activation_bytes);
        for reported in [None, Some(8.0)] {
            let memory = MemoryLimit::gpu(reported);
            assert_eq!(memory, MemoryLimit { bytes: 16 * GIB, source: "default" });
            let v = e.verdict(&GIB_BUFFERS, &memory);
            assert_eq!((v.fits, v.code), (false, Some("device_limits")), "{v:?}");
            let reason = v.reason.unwrap_or_default();
            for number in [e.total_bytes, e.kv_cache_bytes, 16 * GIB] {
                assert!(reason.contains(&number.to_string()), "{number} is not in {reason:?}");
            }
            assert!(reason.contains("16 slots x 32768 tokens") && reason.contains("navigator.deviceMemory"), "{reason}");
        }
        // The CPU backend cannot hold it either: 32-bit wasm memory is 4 GiB.
        assert_eq!((e.cpu.verdict.fits, e.cpu.verdict.code), (false, Some("device_limits")), "{:?}", e.cpu);
        assert!(e.cpu.kv_cache_bytes == e.kv_cache_bytes && e.cpu.bytes > WASM32_MEMORY_BYTES);

        // The engines the tests create fit both.
        let small = Estimate::from_header(&default_header(), Some(512), KvType::F16, 1).unwrap();
        assert_eq!(small.verdict(&GIB_BUFFERS, &MemoryLimit::gpu(None)), Verdict::FITS);
        assert_eq!(small.cpu.verdict, Verdict::FITS);
        // On a machine reporting 4 GiB the ceiling is 4 GiB: 16 slots of 4096 f32 positions
        // (3.0 GiB of cache) fit it, of 8192 (6.0 GiB) do not.
        let four = MemoryLimit::gpu(Some(4.0));
        let at = |context| Estimate::from_header(&default_header(), Some(context), KvType::F32, 16).unwrap().verdict(&GIB_BUFFERS, &four);
        assert!(at(4096).fits);
        let v = at(8192);
        assert!(!v.fits && v.reason.as_deref().unwrap_or_default().contains(&(4 * GIB).to_string()), "{v:?}");
    }

    #[test]
    fn a_draft_model_counts_in_the_cpu_backends_memory_alone() {
        let sized = |context, slots| Estimate::from_header(&default_header(), Some(context), KvType::F32, slots).unwrap();
        // The model as its own draft, sized as the engine loads it: the model's context and slots.
        let (mut e, draft) = (sized(512, 1), sized(512, 1));
        let (cpu, gpu) = (e.cpu.bytes, e.verdict(&GIB_BUFFERS, &MemoryLimit::gpu(None)));
        e.add_draft(&draft).unwrap();
        assert_eq!(e.cpu.draft_bytes, draft.cpu.bytes - ENGINE_BASE_BYTES, "the engine's base counts once");
        assert_eq!(e.cpu.bytes, cpu + e.cpu.draft_bytes);
        assert_eq!(e.cpu.verdict, Verdict::FITS);
        assert_eq!(e.verdict(&GIB_BUFFERS, &MemoryLimit::gpu(None)), gpu, "the GPU runs no draft");

        // 16 slots of 4096 f32 positions (3.0 GiB of cache) fit 32-bit wasm memory; twice that not.
        let (mut e, draft) = (sized(4096, 16), sized(4096, 16));
        assert_eq!(e.cpu.verdict, Verdict::FITS, "{:?}", e.cpu);
        e.add_draft(&draft).unwrap();
        assert_eq!((e.cpu.verdict.fits, e.cpu.verdict.code), (false, Some("device_limits")), "{:?}", e.cpu);
        let reason = e.cpu.verdict.reason.clone().unwrap_or_default();
        assert!(
            reason.contains(&format!("the draft model {}", e.cpu.draft_bytes)) && reason.contains(&e.cpu.bytes.to_string()),
            "{reason}"
        );

        // An encoder drafts nothing.
        let encoder = Estimate { kind: "embedding", ..sized(512, 1) };
        let Err(ModelError::InvalidOption { name, .. }) = sized(512, 1).add_draft(&encoder) else { panic!("an embedding draft") };
        assert_eq!(name, "draft_model");
    }

    #[test]
    fn the_gpu_ceiling_is_the_reported_memory_below_chromes_cap_else_16_gib() {
        let device = |gib: f64| MemoryLimit { bytes: (gib * GIB as f64) as u64, source: "device_memory" };
        assert_eq!(MemoryLimit::gpu(Some(4.0)), device(4.0));
        assert_eq!(MemoryLimit::gpu(Some(0.5)), device(0.5));
        // Chrome's 8 means "8 or more"; a browser reporting more than 16 is believed.
        assert_eq!(MemoryLimit::gpu(Some(8.0)), MemoryLimit { bytes: 16 * GIB, source: "default" });
        assert_eq!(MemoryLimit::gpu(Some(32.0)), device(32.0));
        for nonsense in [None, Some(0.0), Some(-2.0), Some(f64::NAN), Some(f64::INFINITY)] {
            assert_eq!(MemoryLimit::gpu(nonsense).source, "default", "{nonsense:?}");
        }
    }

    #[test]
    fn the_cpu_backend_refuses_a_model_past_32_bit_wasm_memory() {
        // Llama 3.1 8B's shapes in Q4_K (Q6_K embedding): 4.9 GB in the file, more as the CPU
        // backend's integers and f32 scales.
        let e = Estimate::from_header(&synthetic_header("8b"), None, KvType::F16, 1).unwrap();
        assert!(e.cpu.weight_bytes > WASM32_MEMORY_BYTES, "{:?}", e.cpu);
        assert_eq!(e.cpu.memory_limit, MemoryLimit { bytes: WASM32_MEMORY_BYTES, source: "wasm32" });
        assert_eq!((e.cpu.verdict.fits, e.cpu.verdict.code), (false, Some("device_limits")), "{:?}", e.cpu);
        let reason = e.cpu.verdict.reason.clone().unwrap_or_default();
        for number in [e.cpu.bytes, e.cpu.weight_bytes, WASM32_MEMORY_BYTES] {
            assert!(reason.contains(&number.to_string()), "{number} is not in {reason:?}");
        }
        // A GPU with 1 GiB bindings and the default ceiling holds it: `auto` picks WebGPU there.
        assert!(e.verdict(&GIB_BUFFERS, &MemoryLimit::gpu(None)).fits, "{e:?}");
        assert!(e.total_bytes < 16 * GIB);

        // Llama 3.2 1B's shapes fit both.
        let one = Estimate::from_header(&synthetic_header("1b"), None, KvType::F16, 1).unwrap();
        assert_eq!(one.cpu.verdict, Verdict::FITS, "{:?}", one.cpu);
        assert!(one.cpu.bytes < 2 * GIB, "{:?}", one.cpu);
    }
}
