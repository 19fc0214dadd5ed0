//! The model on the GPU: weights, KV cache, activation buffers sized for the largest prefill
//! chunk, and every kernel bound once at load. A forward pass only records prebuilt dispatches
//! and writes the step uniform, so a decode step allocates nothing and submits once.

use std::sync::Arc;

use kestrel_gpu::kernels::attention::{AttentionKernel, AttentionOperands, KvCache};
use kestrel_gpu::kernels::embedding::EmbeddingKernel;
use kestrel_gpu::kernels::matvec::MatvecKernel;
use kestrel_gpu::kernels::rmsnorm::{HeadNormKernel, HeadSpan, RmsNormKernel};
use kestrel_gpu::kernels::rope::{RopeKernel, RopeOperands};
use kestrel_gpu::kernels::sample::{PenaltyBinding, PenaltyKernel, SampleBinding, SampleKernel, TokenMaskBinding, TokenMaskKernel};
use kestrel_gpu::kernels::{Epilogue, OutputColumns};
use kestrel_gpu::{DType, Gpu, GpuError, Readback, Recorder, RowShards, StepParams, StepRows, StepUniform, Tensor, WeightTensor};
use kestrel_ops::params::{AttentionShape, KvType, RopeConfig};
use web_time::Instant;

use crate::config::ModelConfig;
use crate::pacing::SubmitPacer;

mod batch;
mod plan;
mod products;
mod profile;
use batch::SlotSampler;
pub use batch::{BatchSample, BatchSequence};
pub use plan::MAX_VERIFY_ROWS;
use plan::{batch_columns, LastRowCopy, PlannedOp, StepPlan};
use products::{Product, Products};
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

    /// Each part's product, writing its columns of rows of `qkv_width` (with its bias, if any).
    fn products(&self, qkv_width: usize) -> impl Iterator<Item = Product<'_>> {
        self.parts.iter().scan(0u32, move |offset, part| {
            let out = OutputColumns { offset: *offset, stride: qkv_width as u32 };
            *offset += part.weight.rows as u32;
            let bias = part.bias.as_ref();
            let epilogue = if bias.is_some() { Epilogue::BIAS } else { Epilogue::NONE };
            Some(Product::Matrix { weight: &part.weight, bias, epilogue, out })
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

impl LayerWeights {
    /// Bytes of the layer's weight matrices (what a one-token step reads of it).
    fn matrix_bytes(&self) -> u64 {
        self.qkv.byte_size() + self.attn_output.byte_size() + self.gate.byte_size() + self.up.byte_size() + self.down.byte_size()
    }
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
        let layers: u64 = self.layers.iter().map(LayerWeights::matrix_bytes).sum();
        layers + self.lm_head().byte_size() + self.embedding.byte_size() / self.embedding.rows as u64
    }

    pub fn total_bytes(&self) -> u64 {
        let vectors = |l: &LayerWeights| {
            let extra: u64 = l.qk_norm.iter().chain(&l.post_norms).flatten().map(Tensor::byte_size).sum();
            l.attn_norm.byte_size() + l.ffn_norm.byte_size() + l.qkv.bias_byte_size() + extra
        };
        let layers: u64 = self.layers.iter().map(|l| vectors(l) + l.matrix_bytes()).sum();
        layers + self.embedding.byte_size() + self.output_norm.byte_size() + self.output.as_ref().map_or(0, RowShards::byte_size)
    }
}

/// Activation buffers, each sized for `max_chunk` tokens and shared by all layers.
struct Activations {
    token_ids: Tensor,
    /// Each token's KV slot and position.
    rows: StepRows,
    x: Tensor,
    normed: Tensor,
    qkv: Tensor,
    q: Tensor,
    attn: Tensor,
    ffn: Tensor,
    last_normed: Tensor,
    logits: Tensor,
    /// A batched decode step's logits, one row per sequence.
    batch_logits: Tensor,
    /// A verification's logits, one row per token of its chunk.
    verify_logits: Tensor,
    sampled: Tensor,
}

impl Activations {
    /// The buffers for chunks of up to `chunk` tokens and batches of up to `slots` sequences.
    fn new(gpu: &Gpu, c: &ModelConfig, chunk: usize, slots: usize) -> Result<Self, GpuError> {
        let f32t = |label: &str, shape: &[usize]| Tensor::zeros(gpu, label, shape, DType::F32);
        Ok(Self {
            token_ids: Tensor::zeros(gpu, "token_ids", &[chunk], DType::U32)?,
            rows: StepRows::new(gpu, chunk)?,
            x: f32t("x", &[chunk, c.hidden])?,
            normed: f32t("normed", &[chunk, c.hidden])?,
            qkv: f32t("qkv", &[chunk, c.qkv_width()])?,
            q: f32t("q", &[chunk, c.q_width()])?,
            attn: f32t("attn", &[chunk, c.q_width()])?,
            ffn: f32t("ffn", &[chunk, c.ffn])?,
            last_normed: f32t("last_normed", &[c.hidden])?,
            logits: f32t("logits", &[c.vocab])?,
            batch_logits: f32t("batch_logits", &[slots, c.vocab])?,
            verify_logits: f32t("verify_logits", &[plan::MAX_VERIFY_ROWS.min(chunk), c.vocab])?,
            sampled: Tensor::zeros(gpu, "sampled", &[2], DType::U32)?,
        })
    }
}

/// How much a graph holds: the KV cache length and slots, the longest chunk, the cache's type.
#[derive(Clone, Copy, Debug)]
pub struct GraphSize {
    pub max_ctx: usize,
    pub max_chunk: usize,
    pub kv: KvType,
    /// Sequences that can generate at once, each with its own KV cache (1 to `max_chunk`).
    pub slots: usize,
}

pub struct Graph {
    pub gpu: Gpu,
    pub config: ModelConfig,
    pub weights: Weights,
    pub max_ctx: usize,
    pub max_chunk: usize,
    /// KV slots: sequences that can generate at once.
    pub slots: usize,
    step: StepUniform,
    act: Activations,
    /// Each layer's K and V cache (the dispatches' bind groups reference them too).
    pub caches: Vec<KvCache>,
    /// Every kernel of a step, bound once.
    plan: StepPlan,
    /// Also in `plan.sample`; requests write their options here.
    pub penalties: Arc<PenaltyBinding>,
    /// A constrained output's mask, between the penalties and the sampler (off unless set).
    pub token_mask: Arc<TokenMaskBinding>,
    pub sampler: Arc<SampleBinding>,
    /// One per slot, with the submission that last copied into it (`TOKEN_SLOTS`).
    token_readbacks: Vec<Readback>,
    token_submissions: std::sync::Mutex<Vec<Option<kestrel_gpu::wgpu::SubmissionIndex>>>,
    logits_readback: Readback,
    /// A batched step's logits, one row per sampled sequence (read for those that want logprobs).
    batch_readback: Readback,
    /// Each slot's sampler, with its sequence's options (`set_slot_sampling`).
    slot_samplers: Vec<SlotSampler>,
    /// A batched step's sampled tokens and their probabilities, one pair per sampled sequence.
    batch_tokens_readback: Readback,
    /// A verification's logits (`verify_logits`).
    verify_readback: Readback,
}

/// What one submitted step leaves to read.
#[derive(Clone, Debug)]
pub enum StepOutput {
    /// Nothing (a prefill chunk before the last).
    None,
    /// The sampled token id and its probability.
    Token,
    /// The sampled token and the full logits (before penalties).
    TokenAndLogits,
    /// The LM head's logits, left on the device unsampled: `submit_sample` draws from them once
    /// the host has set the constrained output's mask.
    Logits,
}

/// Longest recent-token window the penalties look at (a request's `penalty_last_n`).
pub const MAX_PENALTY_WINDOW: usize = 4096;
/// Most logit-bias entries one request may give.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Room in the penalty entry buffer: the longest recent-token window plus the longest logit-bias
/// list a request may ask for (the engine's request validation refuses more).
pub const PENALTY_CAPACITY: u32 = (MAX_PENALTY_WINDOW + MAX_LOGIT_BIAS) as u32;

/// Token readback buffers: the step with number `s` copies its sampled token into slot
/// `s % TOKEN_SLOTS`, so up to this many steps can be in flight, each read after its own submit.
pub const TOKEN_SLOTS: usize = 4;

/// Where one sequence's step runs: its tokens go to positions `pos..` of KV slot `kv_slot`, its
/// random draw has number `draw` (`StepParams::draw`), and its sampled token goes to readback
/// slot `readback % TOKEN_SLOTS`.
#[derive(Clone, Copy, Debug)]
pub struct StepAt {
    pub kv_slot: usize,
    pub pos: usize,
    pub draw: u32,
    pub readback: usize,
}

impl StepAt {
    /// A step of slot 0 from position `pos` that samples nothing, or draw 0 into readback 0 (a
    /// prompt run from the start).
    pub fn prompt(pos: usize) -> Self {
        Self { kv_slot: 0, pos, draw: 0, readback: 0 }
    }
}

/// Where a step's token ids come from.
#[derive(Clone, Copy)]
pub enum StepInput<'a> {
    /// Ids written by the host (a prompt chunk), run with the prefill kernels.
    Tokens(&'a [u32]),
    /// One id written by the host, run with the decode kernels: a constrained output's token,
    /// chosen on the host, and the decode step the bench times.
    Decode(u32),
    /// The one token the previous step sampled, copied on the GPU: the host can submit the next
    /// decode step before it has read that token.
    Sampled,
}

impl Graph {
    /// How the KV cache stores its values.
    pub fn kv_cache(&self) -> KvType {
        self.caches.first().map_or(KvType::default(), |c| c.kv)
    }

    /// Allocates the cache and activations and binds every kernel. Compiles every pipeline the
    /// model needs (through the cache), so no compilation happens while generating.
    pub async fn new(
        gpu: &Gpu,
        config: ModelConfig,
        weights: Weights,
        rope_config: &RopeConfig,
        size: GraphSize,
    ) -> Result<Self, GpuError> {
        let GraphSize { max_ctx, max_chunk, kv, slots } = size;
        if slots == 0 || slots > max_chunk {
            return Err(GpuError::InvalidArgs(format!("{slots} KV slots: 1 to the longest chunk, {max_chunk}")));
        }
        let c = &config;
        let act = Activations::new(gpu, c, max_chunk, slots)?;
        let step = StepUniform::new(gpu);
        let max_tokens = max_chunk as u32;
        let products = Products { gpu, step: &step, max_tokens };
        let shape = AttentionShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim, max_ctx };
        let norm = RmsNormKernel::new(gpu).await?;
        let post_norm = if c.post_norms { Some(RmsNormKernel::accumulating(gpu).await?) } else { None };
        // Without post norms the O and down products add straight into the hidden state; with
        // them they write `normed` (free by then), and the post norm adds its norm into `x`.
        let (residual_out, residual_epilogue) = if c.post_norms { (&act.normed, Epilogue::NONE) } else { (&act.x, Epilogue::ACCUMULATE) };
        let rope = RopeKernel::new(gpu, kv).await?;
        let head_norm = if c.qk_norm { Some(HeadNormKernel::new(gpu).await?) } else { None };
        let attention = AttentionKernel::new(gpu, c.head_dim, kv).await?;
        let mut plan = StepPlan::with_batches(&batch_columns(slots));
        plan.verify = plan::verify_columns(max_chunk).into_iter().map(|columns| plan::BatchPlan { columns, ops: Vec::new() }).collect();
        let embedding = EmbeddingKernel::new(gpu, weights.embedding.ty, c.embedding_scale).await?;
        for gather in embedding.bind_shards(gpu, &weights.embedding, &act.token_ids, &act.x, &step, max_tokens)? {
            plan.all("embedding", gather);
        }

        let mut caches = Vec::with_capacity(c.n_layers);
        for (l, w) in weights.layers.iter().enumerate() {
            let cache = KvCache::new(gpu, &format!("blk.{l}.kv"), shape, kv, slots)?;
            plan.begin_layer();
            plan.all("rmsnorm", norm.bind(gpu, &step, &act.x, &w.attn_norm, &act.normed, c.rms_eps)?);
            for qkv in w.qkv.products(c.qkv_width()) {
                products.emit(&mut plan, "matvec qkv", qkv, &act.normed, &act.qkv).await?;
            }
            if let (Some(kernel), Some([q_norm, k_norm])) = (&head_norm, &w.qk_norm) {
                let q_span = HeadSpan { offset: 0, heads: c.n_heads, head_dim: c.head_dim };
                let k_span = HeadSpan { offset: c.q_width(), heads: c.n_kv_heads, head_dim: c.head_dim };
                plan.all("rmsnorm", kernel.bind(gpu, &step, &act.qkv, q_norm, q_span, c.rms_eps)?);
                plan.all("rmsnorm", kernel.bind(gpu, &step, &act.qkv, k_norm, k_span, c.rms_eps)?);
            }
            let layer_rope = c.layer_rope(l, rope_config);
            let rotated = RopeOperands { config: layer_rope.as_ref(), qkv: &act.qkv, q_out: &act.q, cache: &cache };
            plan.all("rope", rope.bind(gpu, &step, &act.rows, &rotated)?);
            let scores = c.layer_scores(l);
            let attended = AttentionOperands { q: &act.q, cache: &cache, out: &act.attn, scores: &scores, rows: &act.rows };
            plan.split("attention", attention.bind_decode(gpu, &attended, 1)?, attention.bind_prefill(gpu, &step, &attended)?);
            if slots > 1 {
                plan.every_batch("attention", Arc::new(attention.bind_decode(gpu, &attended, slots)?));
            }
            let o = Product::matrix(&w.attn_output, residual_epilogue);
            products.emit(&mut plan, "matvec o", o, &act.attn, residual_out).await?;
            let post_norms = post_norm.as_ref().zip(w.post_norms.as_ref());
            if let Some((kernel, [attn_post, _])) = post_norms {
                plan.all("rmsnorm", kernel.bind(gpu, &step, &act.normed, attn_post, &act.x, c.rms_eps)?);
            }
            plan.all("rmsnorm", norm.bind(gpu, &step, &act.x, &w.ffn_norm, &act.normed, c.rms_eps)?);
            let gate_up = Product::GateUp { gate: &w.gate, up: &w.up, act: c.gate_activation };
            products.emit(&mut plan, "matvec gate+up swiglu", gate_up, &act.normed, &act.ffn).await?;
            let down = Product::matrix(&w.down, residual_epilogue);
            products.emit(&mut plan, "matvec down", down, &act.ffn, residual_out).await?;
            if let Some((kernel, [_, ffn_post])) = post_norms {
                plan.all("rmsnorm", kernel.bind(gpu, &step, &act.normed, ffn_post, &act.x, c.rms_eps)?);
            }
            caches.push(cache);
        }

        let output_norm: Arc<dyn kestrel_gpu::StepOp> =
            Arc::new(norm.bind(gpu, &step, &act.x, &weights.output_norm, &act.normed, c.rms_eps)?);
        plan.logits.push(PlannedOp { family: "rmsnorm", op: output_norm.clone() });
        plan.output_norm.push(PlannedOp { family: "rmsnorm", op: output_norm.clone() });
        plan.every_batch("rmsnorm", output_norm.clone());
        for verify in &mut plan.verify {
            verify.ops.push(PlannedOp { family: "rmsnorm", op: output_norm.clone() });
        }
        let last_row = LastRowCopy { src: act.normed.buffer.clone(), dst: act.last_normed.buffer.clone(), row_bytes: 4 * c.hidden as u64 };
        plan.logits.push(PlannedOp { family: plan::COPY, op: Arc::new(last_row) });
        let lm = weights.lm_head();
        let lm_kernel = |columns: usize| async move {
            match c.final_softcap {
                Some(cap) => MatvecKernel::soft_capped(gpu, lm.ty, cap, columns as u32).await,
                None => MatvecKernel::batched(gpu, lm.ty, Epilogue::NONE, columns as u32).await,
            }
        };
        for shard in lm_kernel(1).await?.bind_shards(gpu, lm, &act.last_normed, &act.logits)? {
            plan.logits.push(PlannedOp { family: "matvec lm head", op: Arc::new(shard) });
        }
        // A batch's tokens are each their sequence's last: every row of `normed` gets its logits.
        for batch in &mut plan.batches {
            for shard in lm_kernel(batch.columns).await?.bind_shards(gpu, lm, &act.normed, &act.batch_logits)? {
                batch.push("matvec lm head", shard);
            }
        }
        // A verification's rows are a chunk's: every row of `normed` gets its logits.
        for verify in &mut plan.verify {
            for shard in lm_kernel(verify.columns).await?.bind_shards(gpu, lm, &act.normed, &act.verify_logits)? {
                verify.push("matvec lm head", shard);
            }
        }
        let (penalty_kernel, sample_kernel) = (PenaltyKernel::new(gpu).await?, SampleKernel::new(gpu).await?);
        let penalties = Arc::new(penalty_kernel.bind(gpu, &act.logits, PENALTY_CAPACITY)?);
        let token_mask = Arc::new(TokenMaskKernel::new(gpu).await?.bind(gpu, &act.logits)?);
        let sampler = Arc::new(sample_kernel.bind(gpu, &act.logits, &step, &act.sampled)?);
        let slot_samplers =
            (0..slots).map(|_| SlotSampler::new(gpu, c.vocab, &penalty_kernel, &sample_kernel)).collect::<Result<Vec<_>, _>>()?;
        plan.sample.push(PlannedOp { family: "penalties+sample", op: penalties.clone() });
        plan.sample.push(PlannedOp { family: "penalties+sample", op: token_mask.clone() });
        plan.sample.push(PlannedOp { family: "penalties+sample", op: sampler.clone() });
        let token_readbacks = (0..TOKEN_SLOTS).map(|_| Readback::new(gpu, 8)).collect();
        let logits_readback = Readback::new(gpu, act.logits.byte_size());
        let batch_readback = Readback::new(gpu, act.batch_logits.byte_size());
        let batch_tokens_readback = Readback::new(gpu, 8 * slots as u64);
        let verify_readback = Readback::new(gpu, act.verify_logits.byte_size());
        Ok(Self {
            gpu: gpu.clone(),
            config,
            weights,
            max_ctx,
            max_chunk,
            slots,
            step,
            act,
            caches,
            plan,
            penalties,
            token_mask,
            sampler,
            token_readbacks,
            token_submissions: std::sync::Mutex::new(vec![None; TOKEN_SLOTS]),
            logits_readback,
            batch_readback,
            slot_samplers,
            batch_tokens_readback,
            verify_readback,
        })
    }

    /// Records and submits one step: its tokens (at most `max_chunk`) where `at` says, then,
    /// unless `output` is `None`, the LM head on the last token and the sampler, whose token goes
    /// to readback slot `at.readback` (`read_token`).
    pub fn submit_step(&self, input: StepInput, at: StepAt, output: &StepOutput) -> Result<(), GpuError> {
        let step = self.begin_step(input, at)?;
        let mut rec = Recorder::new(&self.gpu);
        if let StepInput::Sampled = input {
            rec.copy(&self.act.sampled.buffer, 0, &self.act.token_ids.buffer, 0, 4);
        }
        // Prompt tokens always take the prefill kernels, even one alone: a token's results then do
        // not depend on how much of its prompt was cached (the matmul computes each row alike
        // whatever the chunk), so a prompt whose cached prefix came from prompts gives the same
        // tokens warm as cold. The decode kernels (matvec, flash-decoding) sum in another order:
        // rows a previous reply wrote may differ from a cold prefill's in the last bits, which
        // a later turn that reuses them can see where two logits are that close.
        let plan = match input {
            StepInput::Tokens(_) => &self.plan.prefill,
            StepInput::Decode(_) | StepInput::Sampled => &self.plan.decode,
        };
        plan::record(&mut rec, plan, &step);
        self.finish_step(rec, &step, output, at.readback);
        Ok(())
    }

    /// `submit_step` of a prompt chunk with its layers cut into pieces (`submit_prefill_paced`).
    pub async fn submit_prompt_paced(
        &self,
        tokens: &[u32],
        at: StepAt,
        output: &StepOutput,
        pacer: &mut SubmitPacer,
    ) -> Result<(), GpuError> {
        let step = self.begin_step(StepInput::Tokens(tokens), at)?;
        self.submit_prefill_paced(&step, pacer, |rec| {
            self.finish_step(rec, &step, output, at.readback);
            Ok(())
        })
        .await
    }

    /// Records the prefill list for `step` in pieces of whole layers (`SubmitPacer`), each
    /// submitted once the previous one has finished, so no submission holds the device much
    /// longer than the pacer's budget and the page is drawn between them; `finish` records what
    /// follows the last layer into the last piece and submits it. The same kernels run in the
    /// same order as in one submission: the same results.
    async fn submit_prefill_paced(
        &self,
        step: &StepParams,
        pacer: &mut SubmitPacer,
        finish: impl FnOnce(Recorder) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let layers = self.plan.layer_starts.len();
        let mut finish = Some(finish);
        let mut first = 0;
        while first < layers {
            let end = first + pacer.layers_per_piece(layers - first);
            let mut rec = Recorder::new(&self.gpu);
            plan::record(&mut rec, self.plan.prefill_part(first, end), step);
            let submitted = Instant::now();
            match finish.take_if(|_| end == layers) {
                Some(finish) => finish(rec)?,
                None => {
                    rec.submit();
                }
            }
            self.gpu.work_done().await?;
            pacer.observe(end - first, submitted.elapsed());
            first = end;
        }
        Ok(())
    }

    /// Checks a step's size and writes its uniforms, rows (all in KV slot `at.kv_slot`: one
    /// sequence's) and token ids.
    fn begin_step(&self, input: StepInput, at: StepAt) -> Result<StepParams, GpuError> {
        let StepAt { kv_slot, pos, draw, .. } = at;
        let n = match input {
            StepInput::Tokens(tokens) => tokens.len(),
            StepInput::Decode(_) | StepInput::Sampled => 1,
        };
        if n == 0 || n > self.max_chunk || pos + n > self.max_ctx {
            return Err(GpuError::InvalidArgs(format!(
                "step of {n} tokens at position {pos} (chunk limit {}, context {})",
                self.max_chunk, self.max_ctx
            )));
        }
        let gpu = &self.gpu;
        let step = StepParams::new(n as u32, pos as u32, draw);
        self.step.write(gpu, &step);
        if kv_slot >= self.slots {
            return Err(GpuError::InvalidArgs(format!("KV slot {kv_slot} of {}", self.slots)));
        }
        self.act.rows.write_run(gpu, kv_slot as u32, pos as u32, n as u32)?;
        match input {
            StepInput::Tokens(tokens) => gpu.write(&self.act.token_ids.buffer, 0, bytemuck::cast_slice(tokens)),
            StepInput::Decode(token) => gpu.write(&self.act.token_ids.buffer, 0, bytemuck::bytes_of(&token)),
            StepInput::Sampled => {}
        }
        Ok(step)
    }

    /// Records the step's output after its layers (unless `output` is `None`: the LM head on the
    /// last token and the sampler into readback slot `slot % TOKEN_SLOTS`) and submits it.
    fn finish_step(&self, mut rec: Recorder, step: &StepParams, output: &StepOutput, slot: usize) {
        let samples = matches!(output, StepOutput::Token | StepOutput::TokenAndLogits);
        if !matches!(output, StepOutput::None) {
            plan::record(&mut rec, &self.plan.logits, step);
        }
        if matches!(output, StepOutput::TokenAndLogits) {
            let size = self.act.logits.byte_size();
            rec.copy(&self.act.logits.buffer, 0, self.logits_readback.buffer(), 0, size);
        }
        if samples {
            self.record_token_draw(&mut rec, step, slot);
        }
        let submission = rec.submit();
        if samples {
            self.note_token_submission(slot, submission);
        }
    }

    /// The penalties, the token mask (when set) and the sampler over the last logits, the token
    /// copied into readback slot `slot % TOKEN_SLOTS`.
    fn record_token_draw(&self, rec: &mut Recorder, step: &StepParams, slot: usize) {
        plan::record(rec, &self.plan.sample, step);
        rec.copy(&self.act.sampled.buffer, 0, self.token_readbacks[slot % TOKEN_SLOTS].buffer(), 0, 8);
    }

    fn note_token_submission(&self, slot: usize, submission: kestrel_gpu::wgpu::SubmissionIndex) {
        if let Ok(mut submissions) = self.token_submissions.lock() {
            submissions[slot % TOKEN_SLOTS] = Some(submission);
        }
    }

    /// Samples the logits a `StepOutput::Logits` step left, with draw number `draw`, into readback
    /// slot `slot % TOKEN_SLOTS` (`read_token`): the second half of a constrained step, once the
    /// host has set its mask (`set_token_mask`).
    pub fn submit_sample(&self, draw: u32, slot: usize) {
        let step = StepParams::new(1, 0, draw);
        self.step.write(&self.gpu, &step);
        let mut rec = Recorder::new(&self.gpu);
        self.record_token_draw(&mut rec, &step, slot);
        let submission = rec.submit();
        self.note_token_submission(slot, submission);
    }

    /// Sets the tokens the next samples may draw (a constrained output's mask, one bit per token:
    /// `token_mask.words()` words), or lets them draw any (None).
    pub fn set_token_mask(&self, mask: Option<&[u32]>) -> Result<(), GpuError> {
        self.token_mask.set(&self.gpu, mask)
    }

    /// The token and its probability sampled by the step that wrote readback slot `slot`
    /// (waiting for that step only, natively).
    pub async fn read_token(&self, slot: usize) -> Result<(u32, f32), GpuError> {
        let slot = slot % TOKEN_SLOTS;
        let submission = self.token_submissions.lock().ok().and_then(|s| s[slot].clone());
        let read = self.token_readbacks[slot].read_after(&self.gpu, 8, submission).await;
        // A fault on the device explains a failed read, and makes a successful one untrustworthy.
        self.gpu.check_faults()?;
        let bytes = read?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        match words.as_slice() {
            [id, prob] => Ok((*id, f32::from_bits(*prob))),
            _ => Err(GpuError::Readback(format!("expected 2 words, got {}", words.len()))),
        }
    }

    /// Runs `tokens` (at most `max_chunk`) at positions `pos..` of slot 0 and returns every
    /// token's final hidden state after the output norm, `[token][hidden]`: what a decoder
    /// embedding model pools (llama.cpp's `result_norm`). The LM head does not run.
    pub async fn normed_rows(&self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, GpuError> {
        let step = self.begin_step(StepInput::Tokens(tokens), StepAt::prompt(pos))?;
        let mut rec = Recorder::new(&self.gpu);
        plan::record(&mut rec, &self.plan.prefill, &step);
        plan::record(&mut rec, &self.plan.output_norm, &step);
        let bytes = 4 * (tokens.len() * self.config.hidden) as u64;
        let readback = Readback::new(&self.gpu, bytes);
        rec.copy(&self.act.normed.buffer, 0, readback.buffer(), 0, bytes);
        let submission = rec.submit();
        let read = readback.read_after(&self.gpu, bytes, Some(submission)).await;
        self.gpu.check_faults()?;
        Ok(bytemuck::pod_collect_to_vec(&read?))
    }

    /// The logits copied by the last `TokenAndLogits` step.
    pub async fn read_logits(&self) -> Result<Vec<f32>, GpuError> {
        let read = self.logits_readback.read_f32(&self.gpu, self.act.logits.byte_size()).await;
        self.gpu.check_faults()?;
        read
    }
}
