//! Will a model fit, before its weights are fetched: from the GGUF header alone, the bytes its
//! weights take on the GPU, its KV cache at a context length, the largest buffer one binding must
//! hold, the tensors of a type the GPU cannot run, and the verdict against a device's limits.
//! The browser package asks this before a download (`estimate()`, and `createEngine` first).

use kestrel_gguf::quant::gpu_sections;
use kestrel_gguf::{is_gpu_supported, GgufHeader, TensorInfo};
use kestrel_gpu::params::KvType;
use serde::Serialize;

use crate::config::ModelConfig;
use crate::load::context_length;
use crate::sequences::MAX_SLOTS;
use crate::tensors::{assign_roles, gpu_runs, Expected, Role};
use crate::LoadOptions;
use crate::ModelError;

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
    pub name: String,
    pub arch: String,
    /// The file's size (where its last tensor ends).
    pub file_bytes: u64,
    /// The weights as packed on the GPU (supported tensors only).
    pub weight_bytes: u64,
    pub context_length: usize,
    /// Sequences that can generate at once, each with its own KV cache.
    pub slots: usize,
    /// K and V of every layer at `context_length` for every slot, in the cache's value type.
    pub kv_cache_bytes: u64,
    /// The largest buffer one binding must hold: a weight matrix (Q, K and V of a layer fused
    /// when they share a type), a layer's K or V cache, a prefill chunk's activations, or the
    /// logits.
    pub largest_binding: Binding,
    pub unsupported: Vec<UnsupportedTensor>,
}

/// What the device allows (WebGPU's adapter limits of the same names).
#[derive(Clone, Copy, Debug)]
pub struct DeviceLimits {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
}

/// Whether the model fits, and if not, the error code and reason loading would fail with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub fits: bool,
    pub code: Option<&'static str>,
    pub reason: Option<String>,
}

impl Estimate {
    /// Sizes the model described by `header` with `slots` KV caches (`LoadOptions::slots`) of
    /// `context_length` tokens (None: the default a load takes) of `kv` values. An architecture,
    /// shape or slot count Kestrel refuses is the same error the load gives.
    pub fn from_header(header: &GgufHeader, context: Option<usize>, kv: KvType, slots: usize) -> Result<Self, ModelError> {
        let c = ModelConfig::from_header(header)?;
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
        // The tensors the model uses, by role; the file's other tensors are never uploaded.
        let roles = assign_roles(header, &c)?;
        let used: Vec<(&TensorInfo, &Expected)> =
            header.tensors.iter().zip(&roles).filter_map(|(t, e)| e.as_ref().map(|e| (t, e))).collect();
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
        let kv_layer = [slots, context, c.head_dim, kv.bytes()].into_iter().fold(c.n_kv_heads as u64, |a, b| a.saturating_mul(b as u64));
        consider(&format!("one layer's K cache ({slots} slot{})", if slots == 1 { "" } else { "s" }), kv_layer);
        // The activations hold a whole prefill chunk.
        let chunk = chunk as u64;
        let widest = [("ffn", c.ffn), ("qkv", c.qkv_width()), ("hidden", c.hidden)].into_iter().max_by_key(|&(_, w)| w);
        if let Some((name, width)) = widest {
            consider(&format!("the {name} activations of a {chunk}-token chunk"), 4 * chunk * width as u64);
        }
        Ok(Self {
            name: c.name.clone(),
            arch: format!("{:?}", c.arch).to_lowercase(),
            file_bytes: header.data_end(),
            weight_bytes,
            context_length: context,
            slots,
            kv_cache_bytes: kv_layer.saturating_mul(2 * c.n_layers as u64),
            largest_binding: largest,
            unsupported,
        })
    }

    /// Whether a device with `limits` can load it.
    pub fn verdict(&self, limits: &DeviceLimits) -> Verdict {
        if let Some(t) = self.unsupported.first() {
            let reason = format!("tensor {:?} has type {}, which Kestrel cannot run on the GPU", t.tensor, t.ty);
            return Verdict { fits: false, code: Some("unsupported_quant"), reason: Some(reason) };
        }
        let limit = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if self.largest_binding.bytes > limit {
            let b = &self.largest_binding;
            let reason = format!("{} needs a {}-byte buffer; this device binds at most {limit} bytes", b.name, b.bytes);
            return Verdict { fits: false, code: Some("device_limits"), reason: Some(reason) };
        }
        Verdict { fits: true, code: None, reason: None }
    }
}

/// Rows of a matrix (ggml's `dims[0]` is the row length).
fn rows(t: &TensorInfo) -> u64 {
    t.dims.iter().skip(1).product()
}

fn packed_bytes(t: &TensorInfo, rows: u64) -> Result<u64, ModelError> {
    let cols = t.dims.first().copied().unwrap_or(1);
    Ok(4 * gpu_sections(t.ggml_type, rows, cols)?.total())
}
