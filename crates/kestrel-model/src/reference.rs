//! The whole model on the CPU in plain f32, built from the kernels' CPU references. Slow and
//! simple on purpose: the tests check the GPU forward pass's logits against it.

use std::collections::HashMap;

use kestrel_gguf::GgufHeader;
use kestrel_gpu::params::{AttentionShape, KvType, RopeConfig, Scores};
use kestrel_gpu::reference::{attention, embedding, matmul, norm, rope};

use crate::config::ModelConfig;
use crate::error::{bad_model, ModelError};
use crate::tensors::{assign_roles, Role};

struct Layer {
    attn_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of Q and K (Qwen3).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// The layer's RoPE (none: SmolLM3's every fourth layer; Gemma's sliding layers have their
    /// own base) and how it scores keys (scale, soft cap, window).
    rope: Option<RopeConfig>,
    scores: Scores,
    /// Gemma's norms of the attention and FFN outputs.
    post_norms: Option<[Vec<f32>; 2]>,
    attn_output: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
}

pub struct ReferenceModel {
    pub config: ModelConfig,
    embedding: Vec<f32>,
    output_norm: Vec<f32>,
    /// None when tied to the embedding.
    output: Option<Vec<f32>>,
    layers: Vec<Layer>,
    shape: AttentionShape,
    /// The values the caches hold: the GPU cache's type, so that both passes attend to the same
    /// keys and values.
    kv: KvType,
    /// Tokens already in the caches.
    pub pos: usize,
}

impl ReferenceModel {
    /// Dequantizes every weight of a parsed file (`tensors[i]` = bytes of `header.tensors[i]`),
    /// for a KV cache of `max_ctx` positions holding `kv` values.
    pub fn new(header: &GgufHeader, tensors: &[Vec<u8>], max_ctx: usize, kv: KvType) -> Result<Self, ModelError> {
        Self::with_config(ModelConfig::from_header(header)?, header, tensors, max_ctx, kv)
    }

    /// The same with a config other than the file's: the tests turn one architectural feature
    /// off (a norm, YaRN, the layers without RoPE) to show that llama.cpp's output depends on it.
    pub fn with_config(
        config: ModelConfig,
        header: &GgufHeader,
        tensors: &[Vec<u8>],
        max_ctx: usize,
        kv: KvType,
    ) -> Result<Self, ModelError> {
        let roles = assign_roles(header, &config)?;
        let mut weights = HashMap::new();
        for ((info, role), bytes) in header.tensors.iter().zip(&roles).zip(tensors) {
            if let Some(e) = role {
                let values = matmul::dequantize_weights(info.ggml_type, bytes, e.rows, e.cols)?;
                weights.insert(e.role, values);
            }
        }
        split_fused(&config, &mut weights);
        let mut take = |role: Role| weights.remove(&role).ok_or_else(|| bad_model(format!("missing {role:?}")));
        let shape = AttentionShape { n_heads: config.n_heads, n_kv_heads: config.n_kv_heads, head_dim: config.head_dim, max_ctx };
        let model_rope = config.rope_config(config.rope_factors_role(max_ctx).map(&mut take).transpose()?)?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let (biased, normed) = (config.qkv_bias, config.qk_norm);
            layers.push(Layer {
                attn_norm: take(Role::AttnNorm(l))?,
                q: take(Role::Q(l))?,
                k: take(Role::K(l))?,
                v: take(Role::V(l))?,
                q_bias: if biased { Some(take(Role::QBias(l))?) } else { None },
                k_bias: if biased { Some(take(Role::KBias(l))?) } else { None },
                v_bias: if biased { Some(take(Role::VBias(l))?) } else { None },
                q_norm: if normed { Some(take(Role::QNorm(l))?) } else { None },
                k_norm: if normed { Some(take(Role::KNorm(l))?) } else { None },
                rope: config.layer_rope(l, &model_rope),
                scores: config.layer_scores(l),
                post_norms: if config.post_norms { Some([take(Role::AttnPostNorm(l))?, take(Role::FfnPostNorm(l))?]) } else { None },
                attn_output: take(Role::AttnOutput(l))?,
                ffn_norm: take(Role::FfnNorm(l))?,
                gate: take(Role::Gate(l))?,
                up: take(Role::Up(l))?,
                down: take(Role::Down(l))?,
                k_cache: vec![0.0; shape.cache_len()],
                v_cache: vec![0.0; shape.cache_len()],
            });
        }
        Ok(Self {
            embedding: take(Role::TokenEmbedding)?,
            output_norm: take(Role::OutputNorm)?,
            output: if config.tied_embeddings { None } else { Some(take(Role::Output)?) },
            config,
            layers,
            shape,
            kv,
            pos: 0,
        })
    }

    /// Runs `tokens` at positions `pos..`, appends them to the caches, and returns the logits
    /// of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 || self.pos + n > self.shape.max_ctx {
            return Err(ModelError::ContextOverflow { needed: self.pos + n, context: self.shape.max_ctx });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ModelError::InvalidOption { name: "tokens", reason: format!("id {bad} >= vocab {}", c.vocab) });
        }
        let (hidden, hd, q_width, kv_width) = (c.hidden, c.head_dim, c.q_width(), c.kv_width());
        let mut x = embedding::embedding(&self.embedding, c.vocab, hidden, tokens);
        if c.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embedding_scale);
        }
        for layer in &mut self.layers {
            let h = norm::rmsnorm(&x, &layer.attn_norm, c.rms_eps);
            let q = add_bias(matmul::matmul(&h, n, &layer.q, q_width, hidden), layer.q_bias.as_deref());
            let k = add_bias(matmul::matmul(&h, n, &layer.k, kv_width, hidden), layer.k_bias.as_deref());
            let v = add_bias(matmul::matmul(&h, n, &layer.v, kv_width, hidden), layer.v_bias.as_deref());
            // Each head is a row of head_dim values for the per-head norms.
            let q = match &layer.q_norm {
                Some(w) => norm::rmsnorm(&q, w, c.rms_eps),
                None => q,
            };
            let k = match &layer.k_norm {
                Some(w) => norm::rmsnorm(&k, w, c.rms_eps),
                None => k,
            };
            let rotate = |x: &[f32], p: usize| layer.rope.as_ref().map_or_else(|| x.to_vec(), |config| rope::rope(x, hd, p, config));
            let mut q_roped = Vec::with_capacity(q.len());
            for t in 0..n {
                let p = self.pos + t;
                q_roped.extend(rotate(&q[t * q_width..][..q_width], p));
                let k_roped = rotate(&k[t * kv_width..][..kv_width], p);
                for kvh in 0..c.n_kv_heads {
                    let at = (kvh * self.shape.max_ctx + p) * hd;
                    let stored = |x: &[f32]| x.iter().map(|&x| self.kv.stored(x)).collect::<Vec<f32>>();
                    layer.k_cache[at..at + hd].copy_from_slice(&stored(&k_roped[kvh * hd..][..hd]));
                    layer.v_cache[at..at + hd].copy_from_slice(&stored(&v[t * kv_width + kvh * hd..][..hd]));
                }
            }
            let attn = attention::attention(&self.shape, &q_roped, &layer.k_cache, &layer.v_cache, self.pos, &layer.scores);
            let o = matmul::matmul(&attn, n, &layer.attn_output, hidden, q_width);
            let post_norm = |y: Vec<f32>, i: usize| match &layer.post_norms {
                Some(weights) => norm::rmsnorm(&y, &weights[i], c.rms_eps),
                None => y,
            };
            x.iter_mut().zip(&post_norm(o, 0)).for_each(|(x, o)| *x += o);
            let h = norm::rmsnorm(&x, &layer.ffn_norm, c.rms_eps);
            let act = matmul::gated(&h, n, &layer.gate, &layer.up, c.ffn, hidden, c.gate_activation);
            let d = matmul::matmul(&act, n, &layer.down, hidden, c.ffn);
            x.iter_mut().zip(&post_norm(d, 1)).for_each(|(x, d)| *x += d);
        }
        self.pos += n;
        let last = norm::rmsnorm(&x[(n - 1) * hidden..], &self.output_norm, c.rms_eps);
        let lm_head = self.output.as_deref().unwrap_or(&self.embedding);
        let logits = matmul::matmul(&last, 1, lm_head, c.vocab, hidden);
        Ok(match c.final_softcap {
            Some(cap) => logits.into_iter().map(|v| cap * (v / cap).tanh()).collect(),
            None => logits,
        })
    }
}

/// Splits the file's fused tensors into the parts the forward pass reads: Phi-3's Q|K|V matrix
/// and bias into Q, K and V, its gate|up matrix into gate and up (row blocks of row-major
/// matrices).
fn split_fused(c: &ModelConfig, weights: &mut HashMap<Role, Vec<f32>>) {
    let (q, kv) = (c.q_width(), c.kv_width());
    for l in 0..c.n_layers {
        for (fused, parts) in [
            (Role::Qkv(l), [(Role::Q(l), q), (Role::K(l), kv), (Role::V(l), kv)]),
            (Role::QkvBias(l), [(Role::QBias(l), q), (Role::KBias(l), kv), (Role::VBias(l), kv)]),
        ] {
            if let Some(values) = weights.remove(&fused) {
                let cols = values.len() / c.qkv_width();
                let mut rest = values.as_slice();
                for (role, rows) in parts {
                    let (part, tail) = rest.split_at(rows * cols);
                    weights.insert(role, part.to_vec());
                    rest = tail;
                }
            }
        }
        if let Some(values) = weights.remove(&Role::GateUp(l)) {
            let (gate, up) = values.split_at(values.len() / 2);
            weights.insert(Role::Gate(l), gate.to_vec());
            weights.insert(Role::Up(l), up.to_vec());
        }
    }
}

fn add_bias(mut y: Vec<f32>, bias: Option<&[f32]>) -> Vec<f32> {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
        }
    }
    y
}
