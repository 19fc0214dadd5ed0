//! Hyper-parameters of a Llama-family model, read from GGUF metadata the way llama.cpp reads
//! them (`{arch}.embedding_length`, `{arch}.attention.head_count`, ...).

use kestrel_gguf::{GgufHeader, Metadata, MetadataValue};
use kestrel_gpu::kernels::attention::HEAD_DIMS;
pub use kestrel_ops::params::{GateActivation, RopeMode};
use kestrel_ops::params::{RopeConfig, Scores, YarnRamp};

use crate::error::{bad_model, ModelError};

/// The architectures of the one Llama-family graph; each differs from `llama` only by the
/// flags its `ModelConfig` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, TinyLlama, Mistral.
    Llama,
    /// Qwen2 / Qwen2.5: biases on Q, K and V, NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head RMSNorm of Q and K before RoPE, NeoX RoPE, head_dim x heads != hidden.
    Qwen3,
    /// SmolLM3: Llama without RoPE in every fourth layer.
    SmolLm3,
    /// Phi-3 / Phi-3.5 mini: fused Q|K|V and gate|up tensors, NeoX RoPE, long/short factors.
    Phi3,
    /// Gemma 2: GeGLU, embedding scaled by sqrt(hidden), post-attention and post-FFN norms,
    /// soft-capped attention scores and logits, sliding-window attention in every other layer.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 without the soft caps, with per-head Q/K norms, sliding windows
    /// in five layers of six, and their own RoPE base.
    Gemma3,
}

impl Arch {
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "llama" => Self::Llama,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "smollm3" => Self::SmolLm3,
            "phi3" => Self::Phi3,
            "gemma2" => Self::Gemma2,
            "gemma3" => Self::Gemma3,
            _ => return None,
        })
    }

    /// The architecture names Kestrel runs, as GGUF's `general.architecture` spells them.
    pub const NAMES: [&'static str; 7] = ["llama", "qwen2", "qwen3", "smollm3", "phi3", "gemma2", "gemma3"];

    /// The name GGUF's `general.architecture` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::SmolLm3 => "smollm3",
            Self::Phi3 => "phi3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
        }
    }

    fn rope_mode(self) -> RopeMode {
        match self {
            Self::Llama | Self::SmolLm3 => RopeMode::Norm,
            Self::Qwen2 | Self::Qwen3 | Self::Phi3 | Self::Gemma2 | Self::Gemma3 => RopeMode::Neox,
        }
    }

    fn is_gemma(self) -> bool {
        matches!(self, Self::Gemma2 | Self::Gemma3)
    }

    /// Every how many layers one has no RoPE (llama.cpp's `n_no_rope_layer_step`, fixed at 4
    /// for SmolLM3 and not read from the file).
    fn no_rope_layer_step(self) -> Option<usize> {
        (self == Self::SmolLm3).then_some(4)
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rope_base: f32,
    pub rope_mode: RopeMode,
    /// Linear RoPE scaling as ggml's `freq_scale` (1 / `rope.scaling.factor`; 1 when unscaled).
    pub rope_freq_scale: f32,
    /// The file has per-pair frequency factors (`rope_freqs.weight`, Llama 3.1 and later).
    pub rope_factors: bool,
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub train_context: usize,
    /// The LM head reuses `token_embd.weight` (no `output.weight` tensor).
    pub tied_embeddings: bool,
    /// The file has Q, K and V biases (Qwen2 always; llama.cpp takes them in any architecture).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Q, K and V are one `attn_qkv` tensor in the file (Phi-3).
    pub fused_qkv_tensor: bool,
    /// Gate and up are one `ffn_up` tensor of `2 * ffn` rows, gate first (Phi-3).
    pub fused_gate_up_tensor: bool,
    /// Every how many layers one has no RoPE (SmolLM3: layers 3, 7, ...).
    pub no_rope_layer_step: Option<usize>,
    /// YaRN's ramp when the file asks for YaRN scaling.
    pub rope_yarn: Option<YarnRamp>,
    /// ggml's `mscale`: `rope.scaling.attn_factor` (Phi-3.5), times YaRN's magnitude correction.
    pub rope_mscale: f32,
    /// Context the RoPE scaling was trained from (`rope.scaling.original_context_length`, else
    /// the training context): Phi-3's long factors apply beyond it.
    pub rope_original_context: usize,
    /// The file has Phi-3's long/short RoPE factors (`rope_factors_{long,short}.weight`).
    pub rope_long_short_factors: bool,
    /// The FFN's gate activation (GELU for Gemma).
    pub gate_activation: GateActivation,
    /// Multiplies the token embeddings (Gemma: sqrt(hidden)).
    pub embedding_scale: f32,
    /// RMSNorm of the attention and FFN outputs before their residual adds (Gemma).
    pub post_norms: bool,
    /// Multiplies q.k (1 / sqrt(head_dim), or Gemma 27B's 1 / sqrt(hidden / heads)).
    pub attention_scale: f32,
    /// Gemma 2's soft cap of the attention scores.
    pub attn_softcap: Option<f32>,
    /// Gemma 2's soft cap of the final logits.
    pub final_softcap: Option<f32>,
    /// The sliding window of the layers that have one (`swa_layers`).
    pub sliding_window: Option<usize>,
    /// Which layers attend through the sliding window (empty: none).
    pub swa_layers: Vec<bool>,
    /// RoPE base and linear scale of the sliding-window layers (Gemma).
    pub rope_base_swa: f32,
    pub rope_freq_scale_swa: f32,
}

/// A positive count the metadata must hold under `key` (a shape: layers, widths, heads).
pub(crate) fn required_count(md: &Metadata, key: &str) -> Result<usize, ModelError> {
    let v = md.get_u64(key)?.ok_or_else(|| bad_model(format!("missing metadata {key}")))?;
    usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| bad_model(format!("{key} = {v} is out of range")))
}

impl ModelConfig {
    pub fn from_header(header: &GgufHeader) -> Result<Self, ModelError> {
        let md = &header.metadata;
        let arch_name = md.get_str("general.architecture")?.ok_or_else(|| bad_model("missing general.architecture"))?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let need = |k: &str| required_count(md, &key(k));
        let hidden = need("embedding_length")?;
        let n_heads = need("attention.head_count")?;
        let n_kv_heads = match md.get_u64(&key("attention.head_count_kv"))? {
            Some(v) => usize::try_from(v).map_err(|_| bad_model("head_count_kv out of range"))?,
            None => n_heads,
        };
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad_model(format!("head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")));
        }
        let head_dim = match md.get_u64(&key("attention.key_length"))? {
            Some(v) => usize::try_from(v).map_err(|_| bad_model("key_length out of range"))?,
            None => hidden / n_heads,
        };
        // Qwen3 (0.6B: 16 heads of 128 over a hidden size of 1024) and Gemma (3 270M: 4 heads of
        // 256 over 640) are the architectures where they differ; elsewhere llama.cpp asserts
        // they agree.
        if head_dim * n_heads != hidden && !matches!(arch, Arch::Qwen3 | Arch::Gemma2 | Arch::Gemma3) {
            return Err(bad_model(format!("head_dim {head_dim} x {n_heads} heads != embedding_length {hidden}")));
        }
        // Refused here, before any weight is downloaded, rather than when the kernels are built.
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(ModelError::UnsupportedArch(format!("{arch_name} with head_dim {head_dim} (attention runs {HEAD_DIMS:?})")));
        }
        if let Some(v) = md.get_u64(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(bad_model(format!("value_length {v} != key_length {head_dim} is not supported")));
            }
        }
        let vocab = match md.get_u64(&key("vocab_size"))? {
            Some(v) => usize::try_from(v).map_err(|_| bad_model("vocab_size out of range"))?,
            None => md
                .get_string_array("tokenizer.ggml.tokens")?
                .map(|t| t.len())
                .ok_or_else(|| bad_model("no vocab_size and no tokenizer.ggml.tokens"))?,
        };
        let rope_base = md.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rms_eps = md.get_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
        if !(rope_base.is_finite() && rope_base > 0.0 && rms_eps.is_finite() && rms_eps > 0.0) {
            return Err(bad_model(format!("rope.freq_base {rope_base} / rms epsilon {rms_eps} out of range")));
        }
        let train_context = need("context_length")?;
        let rope_original_context = match md.get_u64(&key("rope.scaling.original_context_length"))? {
            Some(v) => usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| bad_model(format!("original_context_length {v}")))?,
            None => train_context,
        };
        let scaling = rope_scaling(header, &key)?;
        let attn_factor = md.get_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(bad_model(format!("rope.scaling.attn_factor {attn_factor} is out of range")));
        }
        let (rope_freq_scale, rope_yarn, rope_mscale) = match scaling {
            RopeScaling::Linear(freq_scale) => (freq_scale, None, attn_factor),
            // llama.cpp: ext_factor 1, beta_fast 32, beta_slow 1 for these architectures, and the
            // magnitude correction 1 + 0.1 ln(factor) (llama-context cancels its own copy of it
            // in yarn_attn_factor, so the rope kernel's is the one applied).
            RopeScaling::Yarn(freq_scale) => {
                let ramp = YarnRamp::new(head_dim, rope_original_context, rope_base, 32.0, 1.0);
                (freq_scale, Some(ramp), attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln()))
            }
        };
        if let Some(dims) = md.get_u64(&key("rope.dimension_count"))? {
            if dims as usize != head_dim {
                return Err(bad_model(format!("partial RoPE (rope.dimension_count {dims} < head_dim {head_dim}) is not supported")));
            }
        }
        let has = |name: &str| header.tensors.iter().any(|t| t.name == name);
        let n_layers = need("block_count")?;
        let gemma = gemma_params(arch, md, &key, n_layers, rope_base, rope_freq_scale)?;
        // llama.cpp's gemma 27B rule (by layer count): scores scaled by hidden / heads.
        let is_27b = matches!((arch, n_layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let attention_scale = 1.0 / if is_27b { (hidden / n_heads) as f32 } else { head_dim as f32 }.sqrt();
        Ok(Self {
            arch,
            name: md.get_str("general.name")?.unwrap_or(arch_name).to_string(),
            n_layers,
            hidden,
            ffn: need("feed_forward_length")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            rope_base,
            rope_mode: arch.rope_mode(),
            rope_freq_scale,
            rope_factors: has(ROPE_FACTORS_TENSOR),
            rms_eps,
            train_context,
            // Gemma 2's LM head is always the embedding (llama.cpp ignores an output tensor).
            tied_embeddings: arch == Arch::Gemma2 || !has("output.weight"),
            qkv_bias: arch == Arch::Qwen2 || has("blk.0.attn_q.bias") || has("blk.0.attn_qkv.bias"),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            fused_qkv_tensor: has("blk.0.attn_qkv.weight"),
            fused_gate_up_tensor: arch == Arch::Phi3 && !has("blk.0.ffn_gate.weight"),
            no_rope_layer_step: arch.no_rope_layer_step(),
            rope_yarn,
            rope_mscale,
            rope_original_context,
            rope_long_short_factors: has(ROPE_FACTORS_LONG_TENSOR) || has(ROPE_FACTORS_SHORT_TENSOR),
            gate_activation: if arch.is_gemma() { GateActivation::Gelu } else { GateActivation::Silu },
            embedding_scale: if arch.is_gemma() { (hidden as f32).sqrt() } else { 1.0 },
            post_norms: arch.is_gemma(),
            attention_scale,
            attn_softcap: gemma.attn_softcap,
            final_softcap: gemma.final_softcap,
            sliding_window: gemma.sliding_window,
            swa_layers: gemma.swa_layers,
            rope_base_swa: gemma.rope_base_swa,
            rope_freq_scale_swa: gemma.rope_freq_scale_swa,
        })
    }

    /// How layer `l` scores its keys: the scale, Gemma 2's cap, and the window of a
    /// sliding-window layer.
    pub fn layer_scores(&self, l: usize) -> Scores {
        let window = if self.swa_layers.get(l).copied().unwrap_or(false) { self.sliding_window } else { None };
        Scores { scale: self.attention_scale, softcap: self.attn_softcap, window }
    }

    /// Layer `l`'s RoPE: none (SmolLM3's unrotated layers), the model's, or (a sliding-window
    /// layer of Gemma) the model's with the sliding-window base and scale.
    pub fn layer_rope(&self, l: usize, rope: &RopeConfig) -> Option<RopeConfig> {
        if !self.layer_has_rope(l) {
            return None;
        }
        if self.swa_layers.get(l).copied().unwrap_or(false) {
            return Some(RopeConfig { base: self.rope_base_swa, freq_scale: self.rope_freq_scale_swa, ..rope.clone() });
        }
        Some(rope.clone())
    }

    /// Whether layer `l` rotates Q and K.
    pub fn layer_has_rope(&self, l: usize) -> bool {
        self.no_rope_layer_step.is_none_or(|step| !(l + 1).is_multiple_of(step))
    }

    /// Width of Q (the heads' total, which Qwen3 makes differ from `hidden`).
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the fused Q|K|V projection.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// What Gemma adds to the Llama graph, read as llama.cpp reads it.
struct GemmaParams {
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
    sliding_window: Option<usize>,
    swa_layers: Vec<bool>,
    rope_base_swa: f32,
    rope_freq_scale_swa: f32,
}

/// llama.cpp's Gemma hyper-parameters. Gemma 2: soft caps 50 (scores) and 30 (logits) unless
/// the file says otherwise, a window of 4096 unless `attention.sliding_window` says otherwise,
/// in every other layer (pattern 2, the first of each pair), and the sliding layers' RoPE base
/// and scale equal to the model's unless `rope.freq_base_swa` is set. Gemma 3: no score cap, a
/// logit cap only from the file, a window only when the file has one, in five layers of six
/// (pattern 6), the sliding layers' base from `rope.freq_base_swa` (else 10000) and unscaled.
/// `attention.sliding_window_pattern` (a period, or one bool per layer) overrides the pattern.
fn gemma_params(
    arch: Arch,
    md: &Metadata,
    key: &dyn Fn(&str) -> String,
    n_layers: usize,
    rope_base: f32,
    rope_freq_scale: f32,
) -> Result<GemmaParams, ModelError> {
    let none = GemmaParams {
        attn_softcap: None,
        final_softcap: None,
        sliding_window: None,
        swa_layers: Vec::new(),
        rope_base_swa: rope_base,
        rope_freq_scale_swa: rope_freq_scale,
    };
    let positive = |name: &str, v: f32| {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(bad_model(format!("{name} {v} is out of range")))
        }
    };
    let cap = |name: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
        match md.get_f32(&key(name))?.or(default) {
            None | Some(0.0) => Ok(None),
            Some(v) => positive(name, v).map(Some),
        }
    };
    let window = md.get_u64(&key("attention.sliding_window"))?;
    let (attn_softcap, final_softcap, window, default_pattern, rope_base_swa, rope_freq_scale_swa) = match arch {
        Arch::Gemma2 => (
            cap("attn_logit_softcapping", Some(50.0))?,
            cap("final_logit_softcapping", Some(30.0))?,
            window.or(Some(4096)),
            2,
            rope_base,
            rope_freq_scale,
        ),
        Arch::Gemma3 => (None, cap("final_logit_softcapping", None)?, window, 6, 10_000.0, 1.0),
        _ => return Ok(none),
    };
    let rope_base_swa = positive("rope.freq_base_swa", md.get_f32(&key("rope.freq_base_swa"))?.unwrap_or(rope_base_swa))?;
    let sliding_window = match window {
        None | Some(0) => None,
        Some(w) => Some(usize::try_from(w).map_err(|_| bad_model(format!("sliding_window {w} is out of range")))?),
    };
    let swa_layers = match (sliding_window, md.get(&key("attention.sliding_window_pattern"))) {
        (None, _) => Vec::new(),
        (Some(_), Some(MetadataValue::Array(items))) => {
            let flags: Option<Vec<bool>> = items.iter().map(|v| if let MetadataValue::Bool(b) = v { Some(*b) } else { None }).collect();
            match flags {
                Some(flags) if flags.len() == n_layers => flags,
                _ => return Err(bad_model(format!("attention.sliding_window_pattern must hold {n_layers} bools"))),
            }
        }
        (Some(_), value) => {
            let period = match value {
                Some(v) => {
                    v.as_i128().and_then(|p| usize::try_from(p).ok()).ok_or_else(|| bad_model("sliding_window_pattern out of range"))?
                }
                None => default_pattern,
            };
            // llama.cpp's set_swa_pattern: a period of 0 makes every layer sliding.
            (0..n_layers).map(|l| period == 0 || l % period < period - 1).collect()
        }
    };
    Ok(GemmaParams { attn_softcap, final_softcap, sliding_window, swa_layers, rope_base_swa, rope_freq_scale_swa })
}

/// The tensor of Llama 3.1+'s per-pair RoPE frequency factors.
pub(crate) const ROPE_FACTORS_TENSOR: &str = "rope_freqs.weight";
/// Phi-3's factors for contexts beyond `rope_original_context`, and for those within it.
pub(crate) const ROPE_FACTORS_LONG_TENSOR: &str = "rope_factors_long.weight";
pub(crate) const ROPE_FACTORS_SHORT_TENSOR: &str = "rope_factors_short.weight";

/// The file's RoPE scaling type, with ggml's `freq_scale` (1 / factor).
enum RopeScaling {
    Linear(f32),
    Yarn(f32),
}

/// The RoPE scaling as llama.cpp reads it: the factor from `rope.scaling.factor` (or the older
/// `rope.scale_linear`; 0 or absent is unscaled), the type from `rope.scaling.type`, linear when
/// absent; "none" never scales. Other types (LongRoPE by name, ...) change the angles in ways
/// Kestrel does not implement: run as plain RoPE they would give plausible but wrong text, so
/// they are refused with an error that says so.
fn rope_scaling(header: &GgufHeader, key: &dyn Fn(&str) -> String) -> Result<RopeScaling, ModelError> {
    let md = &header.metadata;
    let factor = md.get_f32(&key("rope.scaling.factor"))?.or(md.get_f32(&key("rope.scale_linear"))?);
    let freq_scale = match factor {
        None | Some(0.0) => 1.0,
        Some(f) if f.is_finite() && f > 0.0 => 1.0 / f,
        Some(f) => return Err(bad_model(format!("rope.scaling.factor {f} is out of range"))),
    };
    match md.get_str(&key("rope.scaling.type"))?.unwrap_or("linear") {
        "none" => Ok(RopeScaling::Linear(1.0)),
        "linear" => Ok(RopeScaling::Linear(freq_scale)),
        // llama.cpp's YaRN at a factor of 1 (or none) is exactly plain RoPE.
        "yarn" => Ok(if freq_scale == 1.0 { RopeScaling::Linear(1.0) } else { RopeScaling::Yarn(freq_scale) }),
        kind => {
            let factor = factor.map_or(String::new(), |f| format!(" with factor {f}"));
            Err(bad_model(format!("RoPE scaling {kind:?}{factor} is not supported yet; run without it the model would give wrong output")))
        }
    }
}

impl ModelConfig {
    /// The RoPE parameters of this model, with the file's frequency factors when it has them
    /// (checked: `head_dim / 2` finite, positive values).
    pub fn rope_config(&self, factors: Option<Vec<f32>>) -> Result<RopeConfig, ModelError> {
        if let Some(f) = &factors {
            if f.len() != self.head_dim / 2 || !f.iter().all(|v| v.is_finite() && *v > 0.0) {
                return Err(bad_model(format!("{ROPE_FACTORS_TENSOR} must hold {} finite positive values", self.head_dim / 2)));
            }
        }
        Ok(RopeConfig {
            mode: self.rope_mode,
            base: self.rope_base,
            freq_scale: self.rope_freq_scale,
            freq_factors: factors,
            yarn: self.rope_yarn,
            mscale: self.rope_mscale,
        })
    }
}
