//! A loaded model and text generation with it: prompt encoding (raw or chat-templated), prefix
//! reuse of the KV cache across requests, chunked prefill, decode with GPU sampling, stop
//! conditions and streamed text.

use std::time::Duration;

use kestrel_gpu::Gpu;
use kestrel_ops::params::{KvType, Penalties, PenaltyEntry, SamplingParams};
use kestrel_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::config::ModelConfig;
use crate::constraint::{OutputConstraint, TokenGrammar, TokenMatcher};
use crate::cpu_backend::CpuBackend;
use crate::cpu_forward::SequenceStep;
use crate::error::bad_model;
use crate::graph::{Graph, KernelFamily, StepHostTime, StepInput, StepOutput, TOKEN_SLOTS};
use crate::host_sampling::HostSampler;
use crate::options::GenerateOptions;
use crate::output::{Accepted, TokenOutput};
use crate::pacing::{check_budget, SubmitPacer, SubmitReport};
use crate::penalties::PenaltyPolicy;
use crate::prefix_snapshot::{self, KvLayout};
use crate::tools::{ToolCall, ToolSyntax};
use crate::ModelError;

/// What to generate from.
pub enum Prompt<'a> {
    /// Text fed as-is (special-token text is still parsed as special tokens).
    Text(&'a str),
    /// A conversation rendered with the model's chat template, ending with an assistant turn.
    Chat(&'a [ChatMessage]),
}

/// Why generation ended, named as OpenAI's API names it ("abort" for a cancelled request); on
/// the wire the lowercase name ("stop", "length", "abort").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// The model stopped after calling tools (`Generation::tool_calls`).
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// Log-probabilities of one generated step. On the wire `{token_id, logprob, bytes, top: [[id,
/// logprob], ...], top_bytes: [bytes, ...]}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLogprobs {
    #[serde(rename = "token_id")]
    pub token: u32,
    pub logprob: f32,
    /// The token's bytes (a token may hold part of a UTF-8 character): with those of `top`, what
    /// an answer shows of the tokens, taken here where the tokenizer is (a remote engine's
    /// answers are written from these, with no tokenizer).
    pub bytes: Vec<u8>,
    /// The most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
    /// The bytes of each of `top`, in its order.
    pub top_bytes: Vec<Vec<u8>>,
}

/// One generated token, as streamed to the caller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenEvent {
    /// None for the final flush of text held back (a split character or a stop-string prefix).
    pub id: Option<u32>,
    /// Text completed by this token (may be empty: a split character or a held stop prefix).
    pub text: String,
    pub logprobs: Option<StepLogprobs>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Tokens in the prompt (prefilled plus reused).
    pub prompt_tokens: usize,
    /// Prompt tokens actually run (the rest were reused from the KV cache).
    pub prefill_tokens: usize,
    pub reused_tokens: usize,
    /// From the start of the request to the first generated token.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    /// Time the host spent blocked waiting for decode steps' tokens, per decode token. With
    /// steps run ahead the device stays busy meanwhile; it is the GPU step time where the GPU is
    /// the bottleneck, and near zero where the host is.
    pub host_wait_ms_per_token: f64,
    /// With a submission budget on the GPU (`Model::set_submit_budget`; else null): the prompt's
    /// submissions and the longest one's time from its submit to its end.
    pub prefill_submissions: Option<usize>,
    pub longest_prefill_submission_ms: Option<f64>,
    /// From the engine receiving the request to its end, queueing included: set by the engine
    /// core's scheduler (`kestrel-engine`), which sees the request arrive; 0 from the model alone.
    #[serde(default)]
    pub e2e_ms: f64,
}

/// A finished generation. On the wire (what the wasm engine resolves to) `{text,
/// prompt_token_ids, token_ids, finish_reason, logprobs, timings}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    #[serde(rename = "prompt_token_ids")]
    pub prompt_tokens: Vec<u32>,
    #[serde(rename = "token_ids")]
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    pub logprobs: Vec<StepLogprobs>,
    /// The calls of a request with `tools`; `text` is then the content around them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

pub struct Model {
    pub(crate) backend: Backend,
    pub(crate) tokenizer: Tokenizer,
    template: ChatTemplate,
    /// How the template has the model write tool calls.
    tool_syntax: ToolSyntax,
    /// Per KV slot, the tokens whose keys and values its cache holds, in order from position 0.
    /// Single-sequence generation uses slot 0; batched sequences (`sequences.rs`) any.
    pub(crate) cached: Vec<Vec<u32>>,
    /// The batched sequences running, oldest first.
    pub(crate) sequences: Vec<crate::sequences::Sequence>,
    pub(crate) next_sequence: u64,
    /// Decode steps kept submitted ahead of the token being read (`set_decode_run_ahead`).
    run_ahead: usize,
    /// With a submission budget (`set_submit_budget`), how prompt chunks are cut on the GPU.
    pub(crate) pacer: Option<SubmitPacer>,
    /// The vocabulary's token trie for constrained outputs, built by the first request that has
    /// a constraint.
    grammar: Option<TokenGrammar>,
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
    fn config(&self) -> &ModelConfig {
        match self {
            Self::Gpu(g) => &g.config,
            Self::Cpu(c) => &c.forward.config,
        }
    }

    fn max_ctx(&self) -> usize {
        match self {
            Self::Gpu(g) => g.max_ctx,
            Self::Cpu(c) => c.forward.max_ctx(),
        }
    }

    fn max_chunk(&self) -> usize {
        match self {
            Self::Gpu(g) => g.max_chunk,
            Self::Cpu(c) => c.max_chunk,
        }
    }

    fn set_sampling(&mut self, params: &SamplingParams) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => g.sampler.set_params(&g.gpu, params)?,
            Self::Cpu(c) => c.set_sampling(params),
        }
        Ok(())
    }

    fn set_penalties(&mut self, penalties: &Penalties, entries: Vec<PenaltyEntry>) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => g.penalties.write(&g.gpu, penalties, &entries)?,
            Self::Cpu(c) => c.set_penalties(penalties, entries),
        }
        Ok(())
    }

    fn submit_step(&mut self, input: StepInput, pos: usize, draw: u32, output: &StepOutput, slot: usize) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.submit_step(input, pos, draw, output, slot)?),
            Self::Cpu(c) => c.submit_step(input, pos, draw, output, slot),
        }
    }

    async fn read_token(&self, slot: usize) -> Result<u32, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.read_token(slot).await?.0),
            Self::Cpu(c) => Ok(c.read_token(slot)),
        }
    }

    async fn read_logits(&self) -> Result<Vec<f32>, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.read_logits().await?),
            Self::Cpu(c) => Ok(c.read_logits()),
        }
    }

    /// A device fault reported after the last read fails the request that was running.
    fn check_faults(&self) -> Result<(), ModelError> {
        match self {
            Self::Gpu(g) => Ok(g.gpu.check_faults()?),
            Self::Cpu(_) => Ok(()),
        }
    }

    fn gpu_graph(&self, what: &'static str) -> Result<&Graph, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g),
            Self::Cpu(_) => Err(ModelError::NeedsGpu(what)),
        }
    }

    fn gpu_graph_mut(&mut self, what: &'static str) -> Result<&mut Graph, ModelError> {
        match self {
            Self::Gpu(g) => Ok(g),
            Self::Cpu(_) => Err(ModelError::NeedsGpu(what)),
        }
    }
}

/// Decode steps in flight by default: the one whose token is being read and two more, so the
/// device has the next step queued while the host reads, streams and checks a token.
pub const DEFAULT_DECODE_RUN_AHEAD: usize = 3;

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
        let tool_syntax = ToolSyntax::of_template(tokenizer.chat_template());
        Ok(Self {
            backend,
            tokenizer,
            template,
            tool_syntax,
            // The GPU backend's slots are allocated at load; the CPU backend's grow with `set_slots`.
            cached: vec![Vec::new(); slots],
            sequences: Vec::new(),
            next_sequence: 0,
            run_ahead: DEFAULT_DECODE_RUN_AHEAD,
            pacer: None,
            grammar: None,
        })
    }

    /// Which backend runs the model.
    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Gpu(_) => BackendKind::Gpu,
            Backend::Cpu(_) => BackendKind::Cpu,
        }
    }

    /// Decode steps kept in flight (1 to `TOKEN_SLOTS`): 1 submits each step after reading the
    /// previous token. Generation with penalties or logprobs always runs one step at a time.
    pub fn set_decode_run_ahead(&mut self, steps: usize) -> Result<(), ModelError> {
        if !(1..=TOKEN_SLOTS).contains(&steps) {
            return Err(ModelError::InvalidOption { name: "decode_run_ahead", reason: format!("must be 1 to {TOKEN_SLOTS}, got {steps}") });
        }
        self.run_ahead = steps;
        Ok(())
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

    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        self.render_chat_for(messages, &GenerateOptions::default())
    }

    /// The conversation as the template renders it for a request with `options`: with its tools
    /// (tools.rs), unless it has none or `tool_choice` is `none`.
    fn render_chat_for(&self, messages: &[ChatMessage], options: &GenerateOptions) -> Result<String, ModelError> {
        let Some(tools) = options.tool_use() else { return Ok(self.template.render(messages, true)?) };
        let messages = tools.messages(self.tool_syntax, messages);
        Ok(self.template.render_with_tools(&messages, Some(&tools.template_value()), true)?)
    }

    /// How this model's template has it write tool calls.
    pub fn tool_syntax(&self) -> ToolSyntax {
        self.tool_syntax
    }

    /// A request's prompt token ids, checked as generation checks them: every option and limit
    /// before the prompt is rendered and encoded, then the prompt against the context.
    pub fn prepare(&self, prompt: &Prompt<'_>, options: &GenerateOptions) -> Result<Vec<u32>, ModelError> {
        options.validate(self.config().vocab)?;
        let tokens = self.encode_for(prompt, options)?;
        self.check_prompt(&tokens)?;
        Ok(tokens)
    }

    /// Token ids of a prompt. BOS is added when the model asks for it and the text does not
    /// already start with it (chat templates often write it themselves).
    pub fn encode(&self, prompt: &Prompt<'_>) -> Result<Vec<u32>, ModelError> {
        self.encode_for(prompt, &GenerateOptions::default())
    }

    fn encode_for(&self, prompt: &Prompt<'_>, options: &GenerateOptions) -> Result<Vec<u32>, ModelError> {
        let text = match prompt {
            Prompt::Text(t) => t.to_string(),
            Prompt::Chat(messages) => self.render_chat_for(messages, options)?,
        };
        let bos = self.tokenizer.bos_text();
        let add_special = !(self.tokenizer.add_bos() && !bos.is_empty() && text.starts_with(&bos));
        Ok(self.tokenizer.encode(&text, add_special)?)
    }

    /// The token ids whose keys and values the KV cache holds for reuse, from position 0 (the
    /// last request's prompt and output).
    pub fn cached_token_ids(&self) -> &[u32] {
        &self.cached[0]
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

    /// The matcher of `options`' constraint (its `response_format`, `regex`, `grammar`, or the
    /// grammar of its tool calls), if it has one, compiled: a bad schema, regex or grammar is an
    /// `invalid_option` error naming it. `generate` and `add_sequence` compile theirs with it; the
    /// bench replays a constraint with it.
    pub fn constraint_matcher(&mut self, options: &GenerateOptions) -> Result<Option<TokenMatcher>, ModelError> {
        let tool_grammar = options.tool_use().map(|tools| tools.grammar(self.tool_syntax));
        let constraint = match (&tool_grammar, options.constraint()?) {
            (Some(lark), _) => OutputConstraint::ToolCalls(lark),
            (None, Some(constraint)) => constraint,
            (None, None) => return Ok(None),
        };
        let grammar = match &mut self.grammar {
            Some(grammar) => grammar,
            empty => empty.insert(TokenGrammar::new(&self.tokenizer, self.backend.config().vocab, constraint.field())?),
        };
        grammar.matcher(constraint).map(Some)
    }

    /// Forgets the cached prefix: the next request prefills from position 0.
    pub fn reset(&mut self) {
        self.cached.iter_mut().for_each(Vec::clear);
    }

    /// Runs `tokens` from position 0 and returns the last position's logits (for tests and
    /// tools; generation never reads full logits unless asked for logprobs).
    pub async fn prompt_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.check_no_sequences()?;
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
        self.check_no_sequences()?;
        self.cached[0].clear();
        let chunk = self.backend.max_chunk();
        let mut rows = Vec::with_capacity(tokens.len() * self.config().hidden);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let pos = i * chunk;
            match &mut self.backend {
                Backend::Gpu(g) => rows.extend(g.normed_rows(part, pos).await?),
                Backend::Cpu(c) => {
                    let step = SequenceStep { slot: 0, pos, tokens: part, logits: false };
                    rows.extend(kestrel_cpu::on_pool(|| c.forward.normed_hidden(&[step]))?);
                }
            }
        }
        Ok(rows)
    }

    pub(crate) fn check_prompt(&self, tokens: &[u32]) -> Result<(), ModelError> {
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

    /// Submits `tokens[from..]` in chunks; the last chunk samples into token slot 0 (and copies
    /// logits when `logits`). With a submission budget on the GPU the chunks go in pieces, and
    /// what they measured is returned.
    /// The token of a constrained step whose forward pass was just submitted: its mask is
    /// computed while the device runs it, then, on the host (`host_sampled`), the step's logits
    /// are read, masked and sampled, or, on the GPU, the mask goes up and the device samples into
    /// readback slot `slot`. Also returns the logits read (host only).
    async fn constrained_token(
        &mut self,
        matcher: &mut TokenMatcher,
        host_sampled: bool,
        host: HostSampler<'_>,
        slot: usize,
    ) -> Result<(u32, Option<Vec<f32>>), ModelError> {
        matcher.prepare()?;
        if host_sampled {
            let logits = self.backend.read_logits().await?;
            return Ok((host.sample(&logits, Some(matcher))?, Some(logits)));
        }
        let graph = self.backend.gpu_graph("a device token mask")?;
        graph.set_token_mask(Some(&matcher.mask_words(graph.token_mask.words())?))?;
        graph.submit_sample(host.draw, slot);
        Ok((graph.read_token(slot).await?.0, None))
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
                (Backend::Gpu(g), Some(pacer)) => g.submit_prompt_paced(input, pos, &output, 0, pacer).await?,
                _ => self.backend.submit_step(StepInput::Tokens(input), pos, 0, &output, 0)?,
            }
            pos = end;
        }
        Ok(self.pacer.as_mut().map(SubmitPacer::take_report))
    }

    /// Generates from `prompt`, calling `on_token` for every generated token; generation stops
    /// early (finish reason "abort") when it returns false.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation, ModelError> {
        self.check_no_sequences()?;
        options.validate(self.config().vocab)?;
        self.check_prompt(prompt)?;
        // A constrained output's tokens are chosen on the host, from each step's logits. The
        // constraint is compiled before any step, so that a bad one fails the request as
        // `invalid_option` and leaves the cached prefix for the next.
        let matcher = self.constraint_matcher(options)?;
        let generation = self.run_generation(prompt, options, matcher, on_token).await;
        if generation.is_err() {
            // The failed steps may have left KV rows unwritten: the next request prefills anew.
            self.cached[0].clear();
        }
        generation
    }

    async fn run_generation(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut matcher: Option<TokenMatcher>,
        on_token: &mut dyn FnMut(&TokenEvent) -> bool,
    ) -> Result<Generation, ModelError> {
        let start = Instant::now();
        let sampling = sampling_params(options);
        self.backend.set_sampling(&sampling)?;
        let policy = PenaltyPolicy::new(options);
        let penalize = policy.is_active();
        let write_penalties = |backend: &mut Backend, history: &[u32]| -> Result<(), ModelError> {
            backend.set_penalties(&policy.penalties, policy.entries(history))
        };
        let reused = reusable_tokens(&self.cached[0], prompt);
        self.cached[0].truncate(reused);
        let mut history = prompt.to_vec();
        write_penalties(&mut self.backend, &history)?;
        let want_logprobs = options.logprobs > 0;
        // A constrained output goes one step at a time, its mask computed while the step runs. On
        // the GPU the mask goes up and the device samples, so only the token comes back; on the
        // CPU backend, or where logprobs read the logits anyway, the host masks and samples.
        let host_sampled = matcher.is_some() && (want_logprobs || matches!(self.backend, Backend::Cpu(_)));
        let want_logits = want_logprobs || host_sampled;
        // A constrained step stops at the logits, unless logprobs want the device's copy of them
        // (the CPU backend's logits are in memory either way).
        let output_kind = if matcher.is_some() && !want_logprobs {
            StepOutput::Logits
        } else if want_logits {
            StepOutput::TokenAndLogits
        } else {
            StepOutput::Token
        };
        if let Backend::Gpu(g) = &self.backend {
            g.set_token_mask(None)?;
        }
        let pieces = self.prefill(prompt, reused, &output_kind).await?;
        let (mut token, mut logits) = match &mut matcher {
            Some(m) => {
                let host = HostSampler { options, sampling: &sampling, history: &history, draw: 0 };
                self.constrained_token(m, host_sampled, host, 0).await?
            }
            None => {
                let logits = if want_logits { Some(self.backend.read_logits().await?) } else { None };
                (self.backend.read_token(0).await?, logits)
            }
        };
        self.cached[0] = prompt.to_vec();
        let ttft = start.elapsed();
        let decode_start = Instant::now();

        // Decode step j feeds generated token j - 1 (taken from the GPU's sampled buffer) at
        // position prompt + j - 1 and samples token j into readback slot j. While token i is read,
        // steps up to i + ahead - 1 are already submitted, so the device never waits for the host;
        // a stop discards the steps run ahead (their KV rows lie past the cached tokens and are
        // overwritten later). Penalties depend on the tokens so far and logprobs read the step's
        // logits buffer, so with either the steps go one at a time.
        let ahead = if penalize || want_logits { 1 } else { self.run_ahead };
        let max_ctx = self.context_length();
        let can_submit = |step: usize| step < options.max_tokens && prompt.len() + step <= max_ctx;
        // Steps submitted, and the step whose token `token` is (the prefill is step 0).
        let mut submitted = 0;
        let mut step = 0;
        let mut host_wait = std::time::Duration::ZERO;

        let mut output = TokenOutput::new(options, self.tool_syntax, prompt);
        let finish_reason = loop {
            // The constraint's end token ends the output unseen, as a model's end token does.
            let complete = match &mut matcher {
                Some(m) if m.is_end(token) => break FinishReason::Stop,
                Some(m) => m.accept(token)?,
                None => false,
            };
            let step_logprobs = match &logits {
                Some(l) if want_logprobs => Some(top_logprobs(l, token, options.logprobs, &self.tokenizer)),
                _ => None,
            };
            match output.accept(&self.tokenizer, options, token, step_logprobs)? {
                Accepted::End => break FinishReason::Stop,
                Accepted::Token { event, stopped: true } => {
                    on_token(&event);
                    break FinishReason::Stop;
                }
                Accepted::Token { event, stopped: false } => {
                    if !on_token(&event) {
                        break FinishReason::Abort;
                    }
                }
            }
            if complete {
                break FinishReason::Stop;
            }
            history.push(token);
            let pos = self.cached[0].len();
            if output.generated.len() >= options.max_tokens || pos + 1 > max_ctx {
                break FinishReason::Length;
            }
            if penalize {
                write_penalties(&mut self.backend, &history)?;
            }
            self.cached[0].push(token);
            step += 1;
            let wait;
            if let Some(m) = &mut matcher {
                self.backend.submit_step(StepInput::Decode(token), pos, step as u32, &output_kind, step)?;
                wait = Instant::now();
                let host = HostSampler { options, sampling: &sampling, history: &history, draw: step as u32 };
                let (next, read) = self.constrained_token(m, host_sampled, host, step).await?;
                token = next;
                logits = read;
            } else {
                // Step `step` is allowed (the checks above); keep `ahead` steps submitted.
                while submitted < step + ahead - 1 && can_submit(submitted + 1) {
                    submitted += 1;
                    self.backend.submit_step(
                        StepInput::Sampled,
                        prompt.len() + submitted - 1,
                        submitted as u32,
                        &output_kind,
                        submitted,
                    )?;
                }
                wait = Instant::now();
                token = self.backend.read_token(step).await?;
                if want_logits {
                    logits = Some(self.backend.read_logits().await?);
                }
            }
            host_wait += wait.elapsed();
        };
        if let Some(rest) = output.flush() {
            on_token(&rest);
        }
        // A fault reported after the last read (the browser delivers them as events) still fails
        // this request rather than the next.
        self.backend.check_faults()?;
        let decode_tokens = output.generated.len().saturating_sub(1);
        let timings = Timings::measured(prompt.len(), reused, ttft, decode_tokens, decode_start.elapsed(), host_wait).with_pieces(pieces);
        let finish_reason = output.finish_reason(finish_reason);
        let TokenOutput { generated, text, logprobs, tool_calls, .. } = output;
        Ok(Generation { prompt_tokens: prompt.to_vec(), tokens: generated, text, finish_reason, timings, logprobs, tool_calls })
    }
}

pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The tokens of `prompt` whose KV rows a cache holding `cached` keeps for it.
pub(crate) fn reusable_tokens(cached: &[u32], prompt: &[u32]) -> usize {
    reusable_prefix(common_prefix(cached, prompt), prompt.len())
}

/// Of a prefix of `shared` tokens that a cache holds of a `prompt_len`-token prompt, the tokens
/// whose KV rows are kept: all but the last prompt token, which always runs for its logits.
pub fn reusable_prefix(shared: usize, prompt_len: usize) -> usize {
    shared.min(prompt_len.saturating_sub(1))
}

/// The sampler's parameters for `options`: its seed, or the clock's.
pub(crate) fn sampling_params(options: &GenerateOptions) -> SamplingParams {
    let seed = options.seed.unwrap_or_else(clock_seed);
    SamplingParams {
        temperature: options.temperature,
        top_k: options.top_k,
        top_p: options.top_p,
        min_p: options.min_p,
        seed: (seed ^ (seed >> 32)) as u32,
    }
}

fn clock_seed() -> u64 {
    web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Log-softmax of `logits`: the chosen token's value and the `n` best, with their bytes.
pub(crate) fn top_logprobs(logits: &[f32], token: u32, n: usize, tokenizer: &Tokenizer) -> StepLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln() as f32;
    let logprob = |l: f32| l - max - log_sum;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(order.len());
    if n > 0 {
        order.select_nth_unstable_by(n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    }
    let mut top: Vec<(u32, f32)> = order[..n].iter().map(|&i| (i, logprob(logits[i as usize]))).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    // Logits past the vocabulary (a padded output) are of no token: no bytes.
    let bytes = |id: u32| tokenizer.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
    StepLogprobs {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        bytes: bytes(token),
        top_bytes: top.iter().map(|&(id, _)| bytes(id)).collect(),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The result as the wasm engine hands it to the browser package (www/index.js reads these
    /// names).
    #[test]
    fn generation_wire_format() {
        let g = Generation {
            prompt_tokens: vec![1, 2],
            tokens: vec![3],
            text: "hi".into(),
            finish_reason: FinishReason::Length,
            timings: Timings { prompt_tokens: 2, decode_tokens: 1, ..Timings::default() },
            logprobs: vec![StepLogprobs {
                token: 3,
                logprob: -0.5,
                bytes: b"hi".to_vec(),
                top: vec![(3, -0.5), (4, f32::NEG_INFINITY)],
                top_bytes: vec![b"hi".to_vec(), vec![0xe2]],
            }],
            tool_calls: Vec::new(),
        };
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!(json["prompt_token_ids"], serde_json::json!([1, 2]));
        assert_eq!(json["token_ids"], serde_json::json!([3]));
        assert_eq!(json["finish_reason"], "length");
        assert_eq!(
            json["logprobs"],
            serde_json::json!([{ "token_id": 3, "logprob": -0.5, "bytes": [104, 105], "top": [[3, -0.5], [4, null]], "top_bytes": [[104, 105], [0xe2]] }])
        );
        let timings = json["timings"].as_object().unwrap();
        for key in [
            "prompt_tokens",
            "prefill_tokens",
            "reused_tokens",
            "ttft_ms",
            "prefill_tok_s",
            "decode_tokens",
            "decode_ms",
            "decode_tok_s",
            "host_wait_ms_per_token",
            "prefill_submissions",
            "longest_prefill_submission_ms",
            "e2e_ms",
        ] {
            assert!(timings.contains_key(key), "timings.{key}");
        }
        assert_eq!(timings.len(), 12);
        for (reason, name) in [
            (FinishReason::Stop, "stop"),
            (FinishReason::Length, "length"),
            (FinishReason::Abort, "abort"),
            (FinishReason::ToolCalls, "tool_calls"),
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), name);
            assert_eq!(reason.as_str(), name);
        }
    }
}
