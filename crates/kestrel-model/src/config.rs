//! Hyper-parameters of a Llama-family model, read from GGUF metadata the way llama.cpp reads
//! them (`{arch}.embedding_length`, `{arch}.attention.head_count`, ...).

use kestrel_gguf::GgufHeader;
use kestrel_gpu::reference::rope::RopeConfig;
pub use kestrel_gpu::reference::rope::RopeMode;

use crate::error::{bad_model, ModelError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, TinyLlama, Mistral.
    Llama,
    /// Qwen2: Llama with biases on Q, K and V, NeoX RoPE.
    Qwen2,
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
}

impl ModelConfig {
    pub fn from_header(header: &GgufHeader) -> Result<Self, ModelError> {
        let md = &header.metadata;
        let arch_name = md.get_str("general.architecture")?.ok_or_else(|| bad_model("missing general.architecture"))?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ModelError::UnsupportedArch(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let need = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = md.get_u64(&full)?.ok_or_else(|| bad_model(format!("missing metadata {full}")))?;
            usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| bad_model(format!("{full} = {v} is out of range")))
        };
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
        if head_dim * n_heads != hidden {
            return Err(bad_model(format!("head_dim {head_dim} x {n_heads} heads != embedding_length {hidden}")));
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
        let rope_freq_scale = rope_freq_scale(header, &key)?;
        if let Some(dims) = md.get_u64(&key("rope.dimension_count"))? {
            if dims as usize != head_dim {
                return Err(bad_model(format!("partial RoPE (rope.dimension_count {dims} < head_dim {head_dim}) is not supported")));
            }
        }
        Ok(Self {
            arch,
            name: md.get_str("general.name")?.unwrap_or(arch_name).to_string(),
            n_layers: need("block_count")?,
            hidden,
            ffn: need("feed_forward_length")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            rope_base,
            rope_mode: match arch {
                Arch::Llama => RopeMode::Norm,
                Arch::Qwen2 => RopeMode::Neox,
            },
            rope_freq_scale,
            rope_factors: header.tensors.iter().any(|t| t.name == ROPE_FACTORS_TENSOR),
            rms_eps,
            train_context: need("context_length")?,
            tied_embeddings: !header.tensors.iter().any(|t| t.name == "output.weight"),
        })
    }

    /// Width of the fused Q|K|V projection.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The tensor of Llama 3.1+'s per-pair RoPE frequency factors.
pub(crate) const ROPE_FACTORS_TENSOR: &str = "rope_freqs.weight";

/// ggml's `freq_scale` from the file's RoPE scaling keys, as llama.cpp reads them: the factor
/// from `rope.scaling.factor` (or the older `rope.scale_linear`), the type from
/// `rope.scaling.type`, linear when absent; type "none" never scales. YaRN and other types
/// change the angles in ways Kestrel does not implement: run as plain RoPE they would give
/// plausible but wrong text, so they are refused with an error that says so.
fn rope_freq_scale(header: &GgufHeader, key: &dyn Fn(&str) -> String) -> Result<f32, ModelError> {
    let md = &header.metadata;
    let factor = md.get_f32(&key("rope.scaling.factor"))?.or(md.get_f32(&key("rope.scale_linear"))?);
    match (md.get_str(&key("rope.scaling.type"))?.unwrap_or("linear"), factor) {
        // llama.cpp reads a factor of 0 as unscaled.
        ("none", _) | ("linear", None | Some(0.0)) => Ok(1.0),
        ("linear", Some(f)) if f.is_finite() && f > 0.0 => Ok(1.0 / f),
        ("linear", Some(f)) => Err(bad_model(format!("rope.scaling.factor {f} is out of range"))),
        (kind, factor) => {
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
        Ok(RopeConfig { mode: self.rope_mode, base: self.rope_base, freq_scale: self.rope_freq_scale, freq_factors: factors })
    }
}
