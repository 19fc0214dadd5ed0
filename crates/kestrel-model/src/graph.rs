//! The model on the GPU: weights, KV cache, activation buffers sized for the largest prefill
//! chunk, and every kernel bound once at load. A forward pass only records prebuilt dispatches
//! and writes the step uniform, so a decode step allocates nothing and submits once.

use kestrel_gpu::kernels::attention::{AttentionKernel, AttentionShape, DecodeAttention, KvCache, PrefillAttention};
use kestrel_gpu::kernels::embedding::{EmbeddingDispatch, EmbeddingKernel};
use kestrel_gpu::kernels::matmul::{MatmulDispatch, MatmulKernel, SwigluMatmulKernel};
use kestrel_gpu::kernels::matvec::{Epilogue, MatvecKernel, OutputColumns, SwigluMatvecKernel};
use kestrel_gpu::kernels::rmsnorm::{HeadNormKernel, HeadSpan, RmsNormDispatch, RmsNormKernel};
use kestrel_gpu::kernels::rope::{RopeDispatch, RopeKernel};
use kestrel_gpu::kernels::sample::{PenaltyBinding, PenaltyKernel, SampleBinding, SampleKernel};
use kestrel_gpu::reference::rope::RopeConfig;
use kestrel_gpu::{DType, Dispatch, Gpu, GpuError, Readback, Recorder, RowShards, StepParams, StepUniform, Tensor, WeightTensor};

use crate::config::ModelConfig;

mod profile;
pub use profile::{KernelFamily, StepHostTime};

/// A weight matrix and its optional bias vector.
pub struct Projection {
    pub weight: WeightTensor,
    pub bias: Option<Tensor>,
}

/// The Q, K and V projections, producing the `[q | k | v]` row RoPE reads: one matrix of their
/// concatenated rows when they share a weight type (one product), else the three matrices, each
/// writing its columns of the row (llama.cpp's Q4_K_M, for one, gives V more bits than Q and K).
pub struct QkvWeights {
    pub parts: Vec<Projection>,
}

impl QkvWeights {
    pub fn byte_size(&self) -> u64 {
        self.parts.iter().map(|p| p.weight.byte_size()).sum()
    }

    fn bias_byte_size(&self) -> u64 {
        self.parts.iter().filter_map(|p| p.bias.as_ref()).map(Tensor::byte_size).sum()
    }

    /// Each part with the output columns it writes in rows of `qkv_width`.
    fn with_columns(&self, qkv_width: usize) -> impl Iterator<Item = (&Projection, OutputColumns)> {
        self.parts.iter().scan(0u32, move |offset, part| {
            let out = OutputColumns { offset: *offset, stride: qkv_width as u32 };
            *offset += part.weight.rows as u32;
            Some((part, out))
        })
    }
}

/// One layer's weights as uploaded.
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub qkv: QkvWeights,
    /// Qwen3's per-head RMSNorm weights of Q and of K.
    pub qk_norm: Option<[Tensor; 2]>,
    /// Gemma's norms of the attention output and of the FFN output.
    pub post_norms: Option<[Tensor; 2]>,
    pub attn_output: WeightTensor,
    pub ffn_norm: Tensor,
    pub gate: WeightTensor,
    pub up: WeightTensor,
    pub down: WeightTensor,
}

pub struct Weights {
    /// The vocabulary x hidden tables, in row shards where one binding cannot hold them.
    pub embedding: RowShards,
    pub output_norm: Tensor,
    /// None when the LM head is the embedding (tied).
    pub output: Option<RowShards>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    pub fn lm_head(&self) -> &RowShards {
        self.output.as_ref().unwrap_or(&self.embedding)
    }

    /// Bytes of weights one decode step reads (every matrix once, the LM head once, one
    /// embedding row): the numerator of the memory-bandwidth roofline.
    pub fn bytes_per_token(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| l.qkv.byte_size() + l.attn_output.byte_size() + l.gate.byte_size() + l.up.byte_size() + l.down.byte_size())
            .sum();
        layers + self.lm_head().byte_size() + self.embedding.byte_size() / self.embedding.rows as u64
    }

    pub fn total_bytes(&self) -> u64 {
        let vectors = |l: &LayerWeights| {
            let extra: u64 = l.qk_norm.iter().chain(&l.post_norms).flatten().map(Tensor::byte_size).sum();
            l.attn_norm.byte_size() + l.ffn_norm.byte_size() + l.qkv.bias_byte_size() + extra
        };
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                vectors(l) + l.qkv.byte_size() + l.attn_output.byte_size() + l.gate.byte_size() + l.up.byte_size() + l.down.byte_size()
            })
            .sum();
        layers + self.embedding.byte_size() + self.output_norm.byte_size() + self.output.as_ref().map_or(0, RowShards::byte_size)
    }
}

/// Activation buffers, each sized for `max_chunk` tokens and shared by all layers.
struct Activations {
    token_ids: Tensor,
    x: Tensor,
    normed: Tensor,
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    ffn: Tensor,
    last_normed: Tensor,
    logits: Tensor,
    sampled: Tensor,
}

/// The products of the Q, K and V parts (one when fused) for one token.
struct QkvDecode(Vec<Dispatch>);

impl QkvDecode {
    fn record(&self, rec: &mut Recorder) {
        self.0.iter().for_each(|d| d.record(rec));
    }
}

/// The products of the Q, K and V parts (one when fused) for a chunk of tokens.
struct QkvPrefill(Vec<MatmulDispatch>);

impl QkvPrefill {
    fn record(&self, rec: &mut Recorder, n_tokens: u32) {
        self.0.iter().for_each(|d| d.record(rec, n_tokens));
    }
}

struct LayerDispatches {
    attn_norm: RmsNormDispatch,
    qkv_decode: QkvDecode,
    qkv_prefill: QkvPrefill,
    /// Qwen3's per-head norms of Q and of K, in place on the QKV rows (empty elsewhere).
    qk_norm: Vec<RmsNormDispatch>,
    rope: RopeDispatch,
    attn_decode: DecodeAttention,
    attn_prefill: PrefillAttention,
    o_decode: Dispatch,
    o_prefill: MatmulDispatch,
    /// Gemma: the O projection writes `normed`, whose norm this adds into the hidden state.
    attn_post_norm: Option<RmsNormDispatch>,
    ffn_norm: RmsNormDispatch,
    gate_up_decode: Dispatch,
    gate_up_prefill: MatmulDispatch,
    down_decode: Dispatch,
    down_prefill: MatmulDispatch,
    ffn_post_norm: Option<RmsNormDispatch>,
}

pub struct Graph {
    pub gpu: Gpu,
    pub config: ModelConfig,
    pub weights: Weights,
    pub max_ctx: usize,
    pub max_chunk: usize,
    step: StepUniform,
    act: Activations,
    /// Kept alive: the dispatches' bind groups reference them.
    _caches: Vec<KvCache>,
    /// One gather per shard of the embedding table.
    embed: Vec<EmbeddingDispatch>,
    layers: Vec<LayerDispatches>,
    output_norm: RmsNormDispatch,
    /// One matvec per shard of the LM head, each writing its rows' logits.
    lm_head: Vec<Dispatch>,
    pub penalties: PenaltyBinding,
    pub sampler: SampleBinding,
    /// One per slot, with the submission that last copied into it (`TOKEN_SLOTS`).
    token_readbacks: Vec<Readback>,
    token_submissions: std::sync::Mutex<Vec<Option<kestrel_gpu::wgpu::SubmissionIndex>>>,
    logits_readback: Readback,
}

/// What one submitted step leaves to read.
pub enum StepOutput {
    /// Nothing (a prefill chunk before the last).
    None,
    /// The sampled token id and its probability.
    Token,
    /// The sampled token and the full logits (before penalties).
    TokenAndLogits,
}

/// Room in the penalty entry buffer: the recent-token window plus a logit-bias list.
pub const PENALTY_CAPACITY: u32 = 4096 + 1024;

/// Token readback buffers: the step with number `s` copies its sampled token into slot
/// `s % TOKEN_SLOTS`, so up to this many steps can be in flight, each read after its own submit.
pub const TOKEN_SLOTS: usize = 4;

/// Where a step's token ids come from.
pub enum StepInput<'a> {
    /// Ids written by the host (a prompt chunk).
    Tokens(&'a [u32]),
    /// The one token the previous step sampled, copied on the GPU: the host can submit the next
    /// decode step before it has read that token.
    Sampled,
}

impl Graph {
    /// Allocates the cache and activations and binds every kernel. Compiles every pipeline the
    /// model needs (through the cache), so no compilation happens while generating.
    pub async fn new(
        gpu: &Gpu,
        config: ModelConfig,
        weights: Weights,
        rope_config: &RopeConfig,
        max_ctx: usize,
        max_chunk: usize,
    ) -> Result<Self, GpuError> {
        let c = &config;
        let chunk = max_chunk;
        let f32t = |label: &str, shape: &[usize]| Tensor::zeros(gpu, label, shape, DType::F32);
        let act = Activations {
            token_ids: Tensor::zeros(gpu, "token_ids", &[chunk], DType::U32)?,
            x: f32t("x", &[chunk, c.hidden])?,
            normed: f32t("normed", &[chunk, c.hidden])?,
            qkv: f32t("qkv", &[chunk, c.qkv_width()])?,
            q: f32t("q", &[chunk, c.q_width()])?,
            attn: f32t("attn", &[chunk, c.q_width()])?,
            ffn: f32t("ffn", &[chunk, c.ffn])?,
            last_normed: f32t("last_normed", &[c.hidden])?,
            logits: f32t("logits", &[c.vocab])?,
            sampled: Tensor::zeros(gpu, "sampled", &[2], DType::U32)?,
        };
        let step = StepUniform::new(gpu);
        let max_tokens = chunk as u32;
        let shape = AttentionShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim, max_ctx };
        let norm = RmsNormKernel::new(gpu).await?;
        let post_norm = if c.post_norms { Some(RmsNormKernel::accumulating(gpu).await?) } else { None };
        // Without post norms the O and down products add straight into the hidden state; with
        // them they write `normed` (free by then), and the post norm adds its norm into `x`.
        let (residual_out, residual_epilogue) = if c.post_norms { (&act.normed, Epilogue::NONE) } else { (&act.x, Epilogue::ACCUMULATE) };
        let rope = RopeKernel::new(gpu).await?;
        let head_norm = if c.qk_norm { Some(HeadNormKernel::new(gpu).await?) } else { None };
        let attention = AttentionKernel::new(gpu, c.head_dim).await?;
        let embed = EmbeddingKernel::new(gpu, weights.embedding.ty, c.embedding_scale).await?.bind_shards(
            gpu,
            &weights.embedding,
            &act.token_ids,
            &act.x,
            &step,
            max_tokens,
        )?;

        let mut caches = Vec::with_capacity(c.n_layers);
        let mut layers = Vec::with_capacity(c.n_layers);
        for (l, w) in weights.layers.iter().enumerate() {
            let cache = KvCache::new(gpu, &format!("blk.{l}.kv"), shape)?;
            let (mut qkv_decode, mut qkv_prefill) = (Vec::new(), Vec::new());
            for (part, out) in w.qkv.with_columns(c.qkv_width()) {
                let (weight, bias) = (&part.weight, part.bias.as_ref());
                let epilogue = if bias.is_some() { Epilogue::BIAS } else { Epilogue::NONE };
                let matvec = MatvecKernel::new(gpu, weight.ty, epilogue).await?;
                qkv_decode.push(matvec.bind_columns(gpu, weight, &act.normed, &act.qkv, out, bias)?);
                let matmul = MatmulKernel::new(gpu, weight.ty, epilogue).await?;
                qkv_prefill.push(matmul.bind_columns(gpu, weight, &act.normed, &act.qkv, out, bias, &step, max_tokens)?);
            }
            let mut qk_norm = Vec::new();
            if let (Some(kernel), Some([q_norm, k_norm])) = (&head_norm, &w.qk_norm) {
                let q_span = HeadSpan { offset: 0, heads: c.n_heads, head_dim: c.head_dim };
                let k_span = HeadSpan { offset: c.q_width(), heads: c.n_kv_heads, head_dim: c.head_dim };
                qk_norm.push(kernel.bind(gpu, &step, &act.qkv, q_norm, q_span, c.rms_eps)?);
                qk_norm.push(kernel.bind(gpu, &step, &act.qkv, k_norm, k_span, c.rms_eps)?);
            }
            let layer_rope = c.layer_rope(l, rope_config);
            let scores = c.layer_scores(l);
            let bind_post_norm = |weights: Option<&Tensor>| match (&post_norm, weights) {
                (Some(kernel), Some(w)) => kernel.bind(gpu, &step, &act.normed, w, &act.x, c.rms_eps).map(Some),
                _ => Ok(None),
            };
            let [attn_post_norm, ffn_post_norm] = match &w.post_norms {
                Some([attn, ffn]) => [bind_post_norm(Some(attn))?, bind_post_norm(Some(ffn))?],
                None => [None, None],
            };
            let activation = c.gate_activation;
            layers.push(LayerDispatches {
                attn_norm: norm.bind(gpu, &step, &act.x, &w.attn_norm, &act.normed, c.rms_eps)?,
                qkv_decode: QkvDecode(qkv_decode),
                qkv_prefill: QkvPrefill(qkv_prefill),
                qk_norm,
                rope: rope.bind(gpu, &step, layer_rope.as_ref(), &act.qkv, &act.q, &cache)?,
                attn_decode: attention.bind_decode(gpu, &step, &act.q, &cache, &act.attn, &scores)?,
                attn_prefill: attention.bind_prefill(gpu, &step, &act.q, &cache, &act.attn, &scores)?,
                o_decode: MatvecKernel::new(gpu, w.attn_output.ty, residual_epilogue).await?.bind(
                    gpu,
                    &w.attn_output,
                    &act.attn,
                    residual_out,
                    None,
                )?,
                o_prefill: MatmulKernel::new(gpu, w.attn_output.ty, residual_epilogue).await?.bind(
                    gpu,
                    &w.attn_output,
                    &act.attn,
                    residual_out,
                    None,
                    &step,
                    max_tokens,
                )?,
                attn_post_norm,
                ffn_norm: norm.bind(gpu, &step, &act.x, &w.ffn_norm, &act.normed, c.rms_eps)?,
                gate_up_decode: SwigluMatvecKernel::new(gpu, w.gate.ty, activation).await?.bind(
                    gpu,
                    &w.gate,
                    &w.up,
                    &act.normed,
                    &act.ffn,
                )?,
                gate_up_prefill: SwigluMatmulKernel::new(gpu, w.gate.ty, activation).await?.bind(
                    gpu,
                    &w.gate,
                    &w.up,
                    &act.normed,
                    &act.ffn,
                    &step,
                    max_tokens,
                )?,
                down_decode: MatvecKernel::new(gpu, w.down.ty, residual_epilogue).await?.bind(
                    gpu,
                    &w.down,
                    &act.ffn,
                    residual_out,
                    None,
                )?,
                down_prefill: MatmulKernel::new(gpu, w.down.ty, residual_epilogue).await?.bind(
                    gpu,
                    &w.down,
                    &act.ffn,
                    residual_out,
                    None,
                    &step,
                    max_tokens,
                )?,
                ffn_post_norm,
            });
            caches.push(cache);
        }
        let output_norm = norm.bind(gpu, &step, &act.x, &weights.output_norm, &act.normed, c.rms_eps)?;
        let lm = weights.lm_head();
        let lm_kernel = match c.final_softcap {
            Some(cap) => MatvecKernel::soft_capped(gpu, lm.ty, cap).await?,
            None => MatvecKernel::new(gpu, lm.ty, Epilogue::NONE).await?,
        };
        let lm_head = lm
            .shards
            .iter()
            .map(|s| {
                let out = OutputColumns { offset: s.first_row as u32, stride: c.vocab as u32 };
                lm_kernel.bind_columns(gpu, &s.weight, &act.last_normed, &act.logits, out, None)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let penalties = PenaltyKernel::new(gpu).await?.bind(gpu, &act.logits, PENALTY_CAPACITY)?;
        let sampler = SampleKernel::new(gpu).await?.bind(gpu, &act.logits, &step, &act.sampled)?;
        let token_readbacks = (0..TOKEN_SLOTS).map(|_| Readback::new(gpu, 8)).collect();
        let logits_readback = Readback::new(gpu, act.logits.byte_size());
        Ok(Self {
            gpu: gpu.clone(),
            config,
            weights,
            max_ctx,
            max_chunk,
            step,
            act,
            _caches: caches,
            embed,
            layers,
            output_norm,
            lm_head,
            penalties,
            sampler,
            token_readbacks,
            token_submissions: std::sync::Mutex::new(vec![None; TOKEN_SLOTS]),
            logits_readback,
        })
    }

    /// Records and submits one step: its tokens (at most `max_chunk`) at positions `pos..`, then,
    /// unless `output` is `None`, the LM head on the last token and the sampler, whose token goes
    /// to readback slot `slot % TOKEN_SLOTS` (`read_token`). `seed` is the step's random value
    /// for the sampler.
    pub fn submit_step(&self, input: StepInput, pos: usize, seed: u32, output: &StepOutput, slot: usize) -> Result<(), GpuError> {
        let n = match input {
            StepInput::Tokens(tokens) => tokens.len(),
            StepInput::Sampled => 1,
        };
        if n == 0 || n > self.max_chunk || pos + n > self.max_ctx {
            return Err(GpuError::InvalidArgs(format!(
                "step of {n} tokens at position {pos} (chunk limit {}, context {})",
                self.max_chunk, self.max_ctx
            )));
        }
        let gpu = &self.gpu;
        let (n32, params) = (n as u32, StepParams::new(n as u32, pos as u32, seed));
        self.step.write(gpu, &params);
        let mut rec = Recorder::new(gpu);
        match input {
            StepInput::Tokens(tokens) => gpu.write(&self.act.token_ids.buffer, 0, bytemuck::cast_slice(tokens)),
            StepInput::Sampled => rec.copy(&self.act.sampled.buffer, 0, &self.act.token_ids.buffer, 0, 4),
        }
        let decode = n == 1;
        self.embed.iter().for_each(|e| e.record(&mut rec, n32));
        for l in &self.layers {
            l.attn_norm.record(&mut rec, n32);
            if decode {
                l.qkv_decode.record(&mut rec);
            } else {
                l.qkv_prefill.record(&mut rec, n32);
            }
            l.qk_norm.iter().for_each(|d| d.record(&mut rec, n32));
            l.rope.record(&mut rec, n32);
            if decode {
                l.attn_decode.record(&mut rec, params.kv_len);
                l.o_decode.record(&mut rec);
            } else {
                l.attn_prefill.record(&mut rec, n32);
                l.o_prefill.record(&mut rec, n32);
            }
            l.attn_post_norm.iter().for_each(|d| d.record(&mut rec, n32));
            l.ffn_norm.record(&mut rec, n32);
            if decode {
                l.gate_up_decode.record(&mut rec);
                l.down_decode.record(&mut rec);
            } else {
                l.gate_up_prefill.record(&mut rec, n32);
                l.down_prefill.record(&mut rec, n32);
            }
            l.ffn_post_norm.iter().for_each(|d| d.record(&mut rec, n32));
        }
        let slot = slot % TOKEN_SLOTS;
        let samples = !matches!(output, StepOutput::None);
        if samples {
            self.output_norm.record(&mut rec, n32);
            let row_bytes = 4 * self.config.hidden as u64;
            rec.copy(&self.act.normed.buffer, (n as u64 - 1) * row_bytes, &self.act.last_normed.buffer, 0, row_bytes);
            self.lm_head.iter().for_each(|d| d.record(&mut rec));
            if matches!(output, StepOutput::TokenAndLogits) {
                let size = self.act.logits.byte_size();
                rec.copy(&self.act.logits.buffer, 0, self.logits_readback.buffer(), 0, size);
            }
            self.penalties.record(&mut rec);
            self.sampler.record(&mut rec);
            rec.copy(&self.act.sampled.buffer, 0, self.token_readbacks[slot].buffer(), 0, 8);
        }
        let submission = rec.submit();
        if samples {
            if let Ok(mut submissions) = self.token_submissions.lock() {
                submissions[slot] = Some(submission);
            }
        }
        Ok(())
    }

    /// The token and its probability sampled by the step that wrote readback slot `slot`
    /// (waiting for that step only, natively).
    pub async fn read_token(&self, slot: usize) -> Result<(u32, f32), GpuError> {
        let slot = slot % TOKEN_SLOTS;
        let submission = self.token_submissions.lock().ok().and_then(|s| s[slot].clone());
        let bytes = self.token_readbacks[slot].read_after(&self.gpu, 8, submission).await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        match words.as_slice() {
            [id, prob] => Ok((*id, f32::from_bits(*prob))),
            _ => Err(GpuError::Readback(format!("expected 2 words, got {}", words.len()))),
        }
    }

    /// The logits copied by the last `TokenAndLogits` step.
    pub async fn read_logits(&self) -> Result<Vec<f32>, GpuError> {
        self.logits_readback.read_f32(&self.gpu, self.act.logits.byte_size()).await
    }
}
