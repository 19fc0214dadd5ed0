//! A loaded model: the network on either backend, its tokenizer and chat template, and its KV
//! slots, with what each slot's cache holds. What a request does with it (prompts, sampling,
//! stop strings, the generation loop) is the engine's (`kestrel-engine`'s `generation`); the
//! forward passes it drives are in `forward.rs`.

use std::time::Duration;

use kestrel_gpu::Gpu;
use kestrel_ops::params::{KvType, Penalties, PenaltyEntry, SamplingParams};
use kestrel_tokenizer::{ChatTemplate, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::cpu_backend::CpuBackend;
use crate::cpu_forward::SequenceStep;
use crate::error::bad_model;
use crate::graph::{Graph, KernelFamily, StepAt, StepHostTime, StepInput, StepOutput};
use crate::pacing::{check_budget, SubmitPacer, SubmitReport};
use crate::prefix_snapshot::{self, KvLayout};
use crate::ModelError;

/// The most KV slots a model takes: a batched step's products hold every sequence's sums in
/// registers (`MAX_MATVEC_COLUMNS`), and each slot is a whole context of keys and values.
pub const MAX_SLOTS: usize = kestrel_gpu::kernels::matvec::MAX_MATVEC_COLUMNS as usize;

pub struct Model {
    pub(crate) backend: Backend,
    pub(crate) tokenizer: Tokenizer,
    template: ChatTemplate,
    /// Per KV slot, the tokens whose keys and values its cache holds, in order from position 0:
    /// what a request whose prompt starts with them reuses. The engine's generation keeps it as
    /// it runs sequences (`set_slot_tokens`); the passes here that overwrite a slot forget it.
    pub(crate) cached: Vec<Vec<u32>>,
    /// With a submission budget (`set_submit_budget`), how prompt chunks are cut on the GPU.
    pub(crate) pacer: Option<SubmitPacer>,
}

/// Where a model's steps run.
pub(crate) enum Backend {
    Gpu(Box<Graph>),
    Cpu(Box<CpuBackend>),
}

/// Which backend runs a model, as the CLI and the npm package name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Gpu,
    Cpu,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Cpu => "cpu",
        }
    }
}

impl Backend {
    pub(crate) fn config(&self) -> &ModelConfig {
        match self {
            Self::Gpu(g) => &g.config,
            Self::Cpu(c) => &c.forward.config,
        }
    }

    pub(crate) fn max_ctx(&self) -> usize {
        match self {
            Self::Gpu(g) => g.max_ctx,
            Self::Cpu(c) => c.forward.max_ctx(),
        }
    }

    pub(crate) fn max_chunk(&self) -> usize {
        match self {
            Self::Gpu(g) => g.max_chunk,
            Self::Cpu(c) => c.max_chunk,
        }
    }

    pub(crate) fn set_sampling(&mut self, params: &SamplingParams) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => g.sampler.set_params(&g.gpu, params)?,
            Self::Cpu(c) => c.set_sampling(params),
        }
        Ok(())
    }

    pub(crate) fn set_penalties(&mut self, penalties: &Penalties, entries: Vec<PenaltyEntry>) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => g.penalties.write(&g.gpu, penalties, &entries)?,
            Self::Cpu(c) => c.set_penalties(penalties, entries),
        }
        Ok(())
    }

    pub(crate) fn submit_step(&mut self, input: StepInput, at: StepAt, output: &StepOutput) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.submit_step(input, at, output)?),
            Self::Cpu(c) => c.submit_step(input, at, output),
        }
    }

    pub(crate) async fn read_token(&self, slot: usize) -> Result<u32, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.read_token(slot).await?.0),
            Self::Cpu(c) => Ok(c.read_token(slot)),
        }
    }

    pub(crate) async fn read_logits(&self) -> Result<Vec<f32>, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.read_logits().await?),
            Self::Cpu(c) => Ok(c.read_logits()),
        }
    }

    /// A device fault reported after the last read fails the request that was running.
    pub(crate) fn check_faults(&self) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.gpu.check_faults()?),
            Self::Cpu(_) => Ok(()),
        }
    }

    pub(crate) fn gpu_graph(&self, what: &'static str) -> Result<&Graph, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g),
            Self::Cpu(_) => Err(ModelError::NeedsGpu(what)),
        }
    }

    pub(crate) fn gpu_graph_mut(&mut self, what: &'static str) -> Result<&mut Graph, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g),
            Self::Cpu(_) => Err(ModelError::NeedsGpu(what)),
        }
    }
}

impl Model {
    pub(crate) fn new(graph: Graph, tokenizer: Tokenizer) -> Result<Self, ModelError> {
        Self::with_backend(Backend::Gpu(Box::new(graph)), tokenizer)
    }

    pub(crate) fn new_cpu(backend: CpuBackend, tokenizer: Tokenizer) -> Result<Self, ModelError> {
        Self::with_backend(Backend::Cpu(Box::new(backend)), tokenizer)
    }

    fn with_backend(backend: Backend, tokenizer: Tokenizer) -> Result<Self, ModelError> {
        let slots = match &backend {
            Backend::Gpu(g) => g.slots,
            Backend::Cpu(_) => 1,
        };
        // A template that does not even compile is a broken file, found before any request.
        let template = ChatTemplate::for_tokenizer(&tokenizer).map_err(|e| bad_model(e.to_string()))?;
        // The GPU backend's slots are allocated at load; the CPU backend's grow with `set_slots`.
        Ok(Self { backend, tokenizer, template, cached: vec![Vec::new(); slots], pacer: None })
    }

    /// Which backend runs the model.
    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Gpu(_) => BackendKind::Gpu,
            Backend::Cpu(_) => BackendKind::Cpu,
        }
    }

    /// Bounds the device time of one GPU submission of a prompt (None: each chunk is one
    /// submission, the fastest where nothing else draws on the device): its chunks go in pieces
    /// of whole layers, each submitted after the previous one finished (`pacing.rs`). The
    /// browser engine sets it from the display's frame time. The CPU backend has no device to
    /// share and keeps none (its prompts report no submissions).
    pub fn set_submit_budget(&mut self, budget: Option<Duration>) -> Result<(), ModelError> {
        let budget = budget.map(check_budget).transpose()?;
        self.pacer = budget.filter(|_| matches!(self.backend, Backend::Gpu(_))).map(SubmitPacer::new);
        Ok(())
    }

    /// The submission budget set by `set_submit_budget` (None on the CPU backend).
    pub fn submit_budget(&self) -> Option<Duration> {
        self.pacer.as_ref().map(SubmitPacer::budget)
    }

    pub fn config(&self) -> &ModelConfig {
        self.backend.config()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The GPU device, on the GPU backend.
    pub fn gpu(&self) -> Option<&Gpu> {
        match &self.backend {
            Backend::Gpu(g) => Some(&g.gpu),
            Backend::Cpu(_) => None,
        }
    }

    pub fn context_length(&self) -> usize {
        self.backend.max_ctx()
    }

    /// Bytes of weights a decode step reads, for the bandwidth roofline.
    pub fn weight_bytes_per_token(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.weights.bytes_per_token(),
            Backend::Cpu(c) => c.forward.matrix_bytes_per_token() as u64,
        }
    }

    /// How the KV cache stores its values.
    pub fn kv_cache(&self) -> KvType {
        match &self.backend {
            Backend::Gpu(g) => g.kv_cache(),
            Backend::Cpu(c) => c.kv_cache(),
        }
    }

    /// The KV cache's memory: every layer's K and V.
    pub fn kv_cache_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.caches.iter().map(|c| c.k.byte_size() + c.v.byte_size()).sum(),
            Backend::Cpu(c) => c.forward.cache_bytes() as u64,
        }
    }

    /// The CPU backend's buffers: its weights, norm and bias vectors and KV caches, which the
    /// will-it-fit estimate predicts (None on the GPU backend, whose device counts its own).
    pub fn cpu_buffer_bytes(&self) -> Option<u64> {
        match &self.backend {
            Backend::Gpu(_) => None,
            Backend::Cpu(c) => Some(c.forward.buffer_bytes() as u64),
        }
    }

    /// The weights' memory, as the backend holds them.
    pub fn weight_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Gpu(g) => g.weights.total_bytes(),
            Backend::Cpu(c) => c.forward.matrix_bytes() as u64,
        }
    }

    /// A decode step at `pos` by kernel family, for benchmarks (`graph::profile`). Running the
    /// families clobbers the KV cache, so the cached prefix is forgotten.
    pub fn decode_families(&mut self, pos: usize) -> Result<Vec<KernelFamily<'_>>, ModelError> {
        self.cached[0].clear();
        Ok(self.backend.gpu_graph_mut("the kernel profile")?.decode_families(pos)?)
    }

    /// Runs one decode step of `token` at `pos` and times its host side (benchmarks). The KV
    /// cache at `pos` is overwritten, so the cached prefix is forgotten.
    pub async fn time_decode_step(&mut self, token: u32, pos: usize) -> Result<StepHostTime, ModelError> {
        self.cached[0].clear();
        Ok(self.backend.gpu_graph_mut("host timing of a GPU step")?.time_decode_step(token, pos).await?)
    }

    /// The model's chat template, compiled at load.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Prompt tokens a step runs at most at once on this backend.
    pub fn max_chunk(&self) -> usize {
        self.backend.max_chunk()
    }

    /// What a paced prefill measured since the last call (None without a submission budget).
    pub fn take_prefill_report(&mut self) -> Option<SubmitReport> {
        self.pacer.as_mut().map(SubmitPacer::take_report)
    }

    fn kv_layout(&self) -> KvLayout {
        KvLayout::of(self.config(), self.kv_cache(), self.context_length())
    }

    /// A snapshot of the cached prefix's KV rows (`prefix_snapshot`), tagged with `model_key`
    /// (the model file's sha256), of at most `max_bytes`: the longest prefix that fits, checked
    /// before any row is read. None when no token fits or none is cached.
    pub async fn save_prefix(&self, model_key: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, ModelError> {
        let graph = self.backend.gpu_graph("KV prefix snapshots")?;
        let layout = self.kv_layout();
        let fits = |n: usize| layout.snapshot_bytes(model_key.len(), n) <= max_bytes;
        let n = self.cached[0].len();
        // Each token adds the same number of bytes: the largest count that fits, by bisection.
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo == 0 {
            return Ok(None);
        }
        let tokens = &self.cached[0][..lo];
        Ok(Some(prefix_snapshot::save(&graph.gpu, &graph.caches, model_key, layout, tokens).await?))
    }

    /// Restores the first `keep` tokens of a snapshot `save_prefix` made from the same model
    /// file (fewer where the snapshot or the context holds fewer): the next request reuses them
    /// as a cached prefix. A corrupt snapshot is `bad_snapshot`, one of another file or setup
    /// `snapshot_mismatch`; either leaves the cache as it was (a GPU failure while the rows are
    /// written forgets the cached prefix instead). Returns the tokens restored.
    pub fn restore_prefix(&mut self, model_key: &str, bytes: &[u8], keep: usize) -> Result<usize, ModelError> {
        let layout = self.kv_layout();
        let graph = self.backend.gpu_graph("KV prefix snapshots")?;
        let snapshot = prefix_snapshot::decode(bytes, model_key, layout, graph.config.vocab)?;
        let n = snapshot.tokens.len();
        // A restored prefix leaves room for the prompt's last token, which always runs.
        let keep = keep.min(n).min(graph.max_ctx - 1);
        if keep == 0 {
            return Ok(0);
        }
        if let Err(e) = prefix_snapshot::write_rows(&graph.gpu, &graph.caches, n, keep, snapshot.rows) {
            // Rows of the cached prefix may be overwritten already.
            self.cached[0].clear();
            return Err(e);
        }
        self.cached[0] = snapshot.tokens[..keep].to_vec();
        Ok(keep)
    }

    /// KV slots: sequences that can run at once.
    pub fn slots(&self) -> usize {
        self.cached.len()
    }

    /// Keeps `n` KV slots (1 to `MAX_SLOTS`): the CPU backend allocates them; the GPU backend
    /// has the slots it was loaded with (`LoadOptions::slots`) and uses the first `n`. The
    /// caller changes them only while no sequence runs.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        let invalid = |reason: String| Err(ModelError::InvalidOption { name: "slots", reason });
        if !(1..=MAX_SLOTS).contains(&n) {
            return invalid(format!("{n}: 1 to {MAX_SLOTS}"));
        }
        match &mut self.backend {
            Backend::Cpu(c) => c.forward.set_slots(n)?,
            Backend::Gpu(g) if n > g.slots => {
                return invalid(format!("{n}: the model was loaded with {} (the load option slots)", g.slots));
            }
            Backend::Gpu(_) => {}
        }
        self.cached.resize_with(n, Vec::new);
        Ok(())
    }

    /// The tokens whose keys and values KV slot `slot` holds for reuse, from position 0.
    pub fn slot_tokens(&self, slot: usize) -> &[u32] {
        self.cached.get(slot).map_or(&[], Vec::as_slice)
    }

    /// Records what KV slot `slot` holds: the tokens whose rows a sequence wrote there (none
    /// while a sequence is writing it, or after a failed step left rows in doubt).
    pub fn set_slot_tokens(&mut self, slot: usize, tokens: Vec<u32>) {
        if let Some(cached) = self.cached.get_mut(slot) {
            *cached = tokens;
        }
    }

    /// The token ids whose keys and values slot 0's cache holds for reuse, from position 0 (the
    /// last request's prompt and output, where requests run one at a time).
    pub fn cached_token_ids(&self) -> &[u32] {
        self.slot_tokens(0)
    }

    /// Forgets the cached prefix: the next request prefills from position 0.
    pub fn reset(&mut self) {
        self.cached.iter_mut().for_each(Vec::clear);
    }

    /// Runs `tokens` from position 0 and returns the last position's logits (for tests and
    /// tools; generation never reads full logits unless asked for logprobs).
    pub async fn prompt_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.check_prompt(tokens)?;
        self.cached[0].clear();
        self.backend.set_sampling(&SamplingParams::greedy())?;
        self.backend.set_penalties(&Penalties::default(), Vec::new())?;
        self.prefill(tokens, 0, &StepOutput::TokenAndLogits).await?;
        self.cached[0] = tokens.to_vec();
        self.backend.read_logits().await
    }

    /// Runs `tokens` from position 0, a chunk at a time, and returns every token's final hidden
    /// state after the output norm (`[token][hidden]`), without the LM head: what a decoder
    /// embedding model pools. The cache keeps no conversation after it (its rows are the input's).
    pub async fn normed_hidden(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.cached[0].clear();
        let chunk = self.backend.max_chunk();
        let mut rows = Vec::with_capacity(tokens.len() * self.config().hidden);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let pos = i * chunk;
            match &mut self.backend {
                Backend::Gpu(g) => rows.extend(g.normed_rows(part, pos).await?),
                Backend::Cpu(c) => {
                    let step = SequenceStep { slot: 0, pos, tokens: part, logits: 0 };
                    rows.extend(kestrel_cpu::on_pool(|| c.forward.normed_hidden(&[step]))?);
                }
            }
        }
        Ok(rows)
    }

    /// Checks a prompt's token ids against the model: not empty, a position left for the first
    /// generated token, every id in the vocabulary.
    pub fn check_prompt(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidOption { name: "prompt", reason: "is empty".into() });
        }
        // At least one position must remain for the first generated token.
        if tokens.len() >= self.context_length() {
            return Err(ModelError::ContextOverflow { needed: tokens.len() + 1, context: self.context_length() });
        }
        let vocab = self.config().vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::InvalidOption { name: "prompt", reason: format!("token id {bad} >= vocabulary {vocab}") });
        }
        Ok(())
    }

    /// Runs `tokens[from..]` in chunks; the last chunk leaves `last` (the earlier ones nothing).
    async fn prefill(&mut self, tokens: &[u32], from: usize, last: &StepOutput) -> Result<Option<SubmitReport>, ModelError> {
        // What a failed prefill's pieces measured is not this one's.
        self.pacer.as_mut().map(SubmitPacer::take_report);
        let chunk = self.backend.max_chunk();
        let mut pos = from;
        while pos < tokens.len() {
            let end = (pos + chunk).min(tokens.len());
            let output = if end == tokens.len() { last.clone() } else { StepOutput::None };
            let input = &tokens[pos..end];
            match (&self.backend, self.pacer.as_mut()) {
                (Backend::Gpu(g), Some(pacer)) => g.submit_prompt_paced(input, StepAt::prompt(pos), &output, pacer).await?,
                _ => self.backend.submit_step(StepInput::Tokens(input), StepAt::prompt(pos), &output)?,
            }
            pos = end;
        }
        Ok(self.pacer.as_mut().map(SubmitPacer::take_report))
    }
}
