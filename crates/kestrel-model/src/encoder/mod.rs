//! Embedding models: encoders (`bert`, `nomic-bert`) read from GGUF as llama.cpp reads them, run
//! on the CPU backend's kernels or, loaded for a GPU (natively or in the page), with their layers
//! on the GPU (`gpu`), and decoders with a pooling type (Qwen3-Embedding) on either backend; and
//! the `Embedder` that turns texts into pooled, normalized vectors. Embedding is async because a
//! GPU pass awaits its readback (a browser cannot block on it); native callers block on it.

mod config;
mod decoder;
mod forward;
mod gelu;
mod gpu;
mod loading;
mod weights;

pub use config::{EncoderArch, EncoderConfig, Pooling};
pub use decoder::{decoder_pooling, DecoderEmbedder};
pub use forward::{Encoder, EncoderTensors};
pub(crate) use loading::{gpu_declines, on_gpu, EncoderLoading};
pub use weights::{check_complete, check_shape, expected_tensors, EncoderTensor, Kind};

pub(crate) use gpu::GpuEncoder;

use kestrel_tokenizer::Tokenizer;

use crate::cpu_backend::Quantized;
use crate::error::ModelError;

/// The most inputs one call embeds (OpenAI's limit for `input` arrays).
pub const MAX_INPUTS: usize = 2048;

/// Tokens one forward pass packs at most: a call's inputs are embedded in passes of about this
/// many tokens, so that the activations of a large call stay a few tens of megabytes.
pub const TOKENS_PER_PASS: usize = 4096;

/// One input: a text, or token ids as the model's tokenizer gives them (OpenAI's `input` takes
/// both).
#[derive(Clone, Copy, Debug)]
pub enum EmbedInput<'a> {
    Text(&'a str),
    Tokens(&'a [u32]),
}

#[derive(Clone, Copy, Debug)]
pub struct EmbedOptions {
    /// Keep the first `dimensions` values and normalize those (Matryoshka models); None: all.
    pub dimensions: Option<usize>,
    /// L2-normalize each vector (OpenAI's embeddings are unit vectors); false gives the pooled
    /// values as llama.cpp returns them.
    pub normalize: bool,
    /// An input longer than the model's context is cut to it (keeping its closing `[SEP]`) rather
    /// than refused.
    pub truncate: bool,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self { dimensions: None, normalize: true, truncate: false }
    }
}

/// The vectors of a call, in input order, and the tokens they took.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub prompt_tokens: usize,
}

/// A reranker's scores for a query's documents, in document order, and the tokens they took.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranking {
    /// Each document's relevance to the query, a probability in [0, 1] as node-llama-cpp's
    /// `LlamaRankingContext.rankAll` gives it: the sigmoid of the classifier head's first value
    /// (the logit llama.cpp's server returns as `relevance_score` for such a model).
    pub scores: Vec<f32>,
    pub prompt_tokens: usize,
}

/// What an embedding model is, whichever kind runs it.
#[derive(Clone, Debug)]
pub struct EmbedderInfo {
    /// GGUF's `general.architecture`.
    pub arch: &'static str,
    pub name: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub vocab: usize,
    /// Positions the model was trained for.
    pub train_context: usize,
    pub pooling: Pooling,
    /// The longest input in tokens: an encoder's training context, a decoder's KV cache.
    pub context_length: usize,
}

/// The pass that embeds. The decoder's (the chat graph's) and the GPU encoder's are boxed, so
/// that the variants stay near one another's size; the CPU encoder's stays inline.
#[allow(clippy::large_enum_variant)]
enum Pass {
    Encoder(Encoder<Quantized>),
    /// An encoder loaded for a GPU: its layers run there (boxed as the decoder is).
    GpuEncoder(Box<GpuEncoder>),
    Decoder(Box<DecoderEmbedder>),
}

/// An embedding model with its tokenizer: an encoder on the CPU backend or with its layers on
/// the GPU, or a decoder on either.
pub struct Embedder {
    info: EmbedderInfo,
    pass: Pass,
    tokenizer: Tokenizer,
    /// Loaded for a GPU that does not run it: why (`gpu_declined`).
    gpu_declined: Option<String>,
}

impl Embedder {
    pub fn new(encoder: Encoder<Quantized>, tokenizer: Tokenizer) -> Self {
        let info = encoder_info(&encoder.config);
        Self { info, pass: Pass::Encoder(encoder), tokenizer, gpu_declined: None }
    }

    /// An encoder whose layers run on the GPU.
    pub(crate) fn gpu_encoder(encoder: GpuEncoder, tokenizer: Tokenizer) -> Self {
        Self { info: encoder_info(encoder.config()), pass: Pass::GpuEncoder(Box::new(encoder)), tokenizer, gpu_declined: None }
    }

    /// The GPU device its layers run on, where they run on one.
    pub fn gpu(&self) -> Option<&kestrel_gpu::Gpu> {
        match &self.pass {
            Pass::GpuEncoder(e) => Some(e.gpu()),
            Pass::Decoder(d) => d.gpu(),
            Pass::Encoder(_) => None,
        }
    }

    /// Where the model's layers run: "gpu" or "cpu".
    pub fn backend(&self) -> &'static str {
        if self.gpu().is_some() {
            "gpu"
        } else {
            "cpu"
        }
    }

    /// A decoder embedding model (Qwen3-Embedding).
    pub fn decoder(decoder: DecoderEmbedder, tokenizer: Tokenizer) -> Self {
        Self { info: decoder.info().clone(), pass: Pass::Decoder(Box::new(decoder)), tokenizer, gpu_declined: None }
    }

    /// The model was loaded for a GPU that does not run it, for the reason `why`.
    pub(crate) fn declined_gpu(self, why: impl Into<String>) -> Self {
        Self { gpu_declined: Some(why.into()), ..self }
    }

    /// Why the GPU it was loaded for does not run it; None where it was loaded for the CPU
    /// backend or its layers run on the GPU.
    pub fn gpu_declined(&self) -> Option<&str> {
        self.gpu_declined.as_deref()
    }

    pub fn config(&self) -> &EmbedderInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// What the model does, as `Estimate::kind` says it: "reranker" (rank pooling: it scores
    /// documents against a query, `rerank`) or "embedding" (it embeds texts, `embed`).
    pub fn kind(&self) -> &'static str {
        kind(self.info.pooling)
    }

    /// The length of the vectors `embed` returns without `dimensions`.
    pub fn dimensions(&self) -> usize {
        self.info.hidden
    }

    /// The longest input in tokens, the special tokens included.
    pub fn context_length(&self) -> usize {
        self.info.context_length
    }

    pub fn weight_bytes(&self) -> usize {
        match &self.pass {
            Pass::Encoder(e) => e.weight_bytes(),
            Pass::GpuEncoder(e) => e.weight_bytes(),
            Pass::Decoder(d) => d.weight_bytes(),
        }
    }

    /// The token ids `input` is embedded from: a text with the model's special tokens added as
    /// llama.cpp's embedding contexts add them (`[CLS]` ... `[SEP]`; a decoder's BOS and EOS where
    /// its vocabulary adds them), ids as given. Checked: no input
    /// is empty, every id is in the vocabulary, and none is longer than the context (unless
    /// `truncate`).
    pub fn tokens(&self, input: EmbedInput<'_>, truncate: bool) -> Result<Vec<u32>, ModelError> {
        let mut tokens = match input {
            EmbedInput::Text(text) => {
                if text.is_empty() {
                    return Err(ModelError::InvalidOption { name: "input", reason: "an input is an empty string".into() });
                }
                self.tokenizer.encode_with(text, true, false)?
            }
            EmbedInput::Tokens(ids) => {
                if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.info.vocab) {
                    let reason = format!("token id {bad} is outside the vocabulary of {}", self.info.vocab);
                    return Err(ModelError::InvalidOption { name: "input", reason });
                }
                ids.to_vec()
            }
        };
        if tokens.is_empty() {
            return Err(ModelError::InvalidOption { name: "input", reason: "an input has no tokens".into() });
        }
        let context = self.context_length();
        if tokens.len() > context {
            if !truncate {
                return Err(ModelError::ContextOverflow { needed: tokens.len(), context });
            }
            // The closing token stays: the model was trained on inputs that end with it.
            let last = tokens.last().copied().filter(|_| self.tokenizer.add_eos());
            tokens.truncate(context);
            if let (Some(last), Some(end)) = (last, tokens.last_mut()) {
                *end = last;
            }
        }
        Ok(tokens)
    }

    /// The embeddings of `inputs` (1 to `MAX_INPUTS`): every input is checked before any is run.
    /// A reranker (rank pooling) gives scores, not embeddings: refused.
    pub async fn embed(&self, inputs: &[EmbedInput<'_>], options: &EmbedOptions) -> Result<Embeddings, ModelError> {
        if self.info.pooling == Pooling::Rank {
            let reason = "this is a reranker (pooling_type 4, rank): it scores documents against a query (rerank), it does not embed";
            return Err(ModelError::InvalidOption { name: "model", reason: reason.into() });
        }
        if inputs.is_empty() || inputs.len() > MAX_INPUTS {
            let reason = format!("{} inputs: 1 to {MAX_INPUTS} per call", inputs.len());
            return Err(ModelError::InvalidOption { name: "input", reason });
        }
        if let Some(d) = options.dimensions {
            if d == 0 || d > self.dimensions() {
                let reason = format!("{d}: 1 to the model's {}", self.dimensions());
                return Err(ModelError::InvalidOption { name: "dimensions", reason });
            }
        }
        let tokens = inputs.iter().map(|&i| self.tokens(i, options.truncate)).collect::<Result<Vec<_>, _>>()?;
        let prompt_tokens = tokens.iter().map(Vec::len).sum();
        let mut vectors = self.run_packed(tokens).await?;
        for v in &mut vectors {
            if let Some(d) = options.dimensions {
                v.truncate(d);
            }
            if options.normalize {
                normalize(v);
            }
        }
        Ok(Embeddings { vectors, prompt_tokens })
    }

    /// The tokens a reranker scores for `query` and `document`, built as node-llama-cpp's
    /// `LlamaRankingContext` builds them: each text tokenized without special tokens, then
    /// `[BOS] query [EOS] [SEP] document [EOS]`, leaving out each special token the vocabulary
    /// lacks (a WordPiece vocabulary has BOS = `[CLS]` and SEP = `[SEP]`, and EOS only where the file
    /// names one). Empty when both texts give no tokens: such a pair scores 0 unrun, as there.
    pub fn rank_tokens(&self, query: &str, document: &str) -> Result<Vec<u32>, ModelError> {
        let query = self.tokenizer.encode_with(query, false, false)?;
        let document = self.tokenizer.encode_with(document, false, false)?;
        if query.is_empty() && document.is_empty() {
            return Ok(Vec::new());
        }
        let (bos, eos, sep) = (self.tokenizer.bos_id(), self.tokenizer.eos_id(), self.tokenizer.sep_id());
        let mut tokens = Vec::with_capacity(query.len() + document.len() + 4);
        tokens.extend(bos);
        tokens.extend(query);
        tokens.extend(eos);
        tokens.extend(sep);
        tokens.extend(document);
        tokens.extend(eos);
        Ok(tokens)
    }

    /// How relevant each of `documents` (1 to `MAX_INPUTS`) is to `query`, on a reranker
    /// (cross-encoder, rank pooling): each pair's tokens (`rank_tokens`) through the encoder and
    /// its classifier head, all pairs packed into as few passes as embedding packs inputs into.
    /// A pair longer than the model's context is refused (`context_overflow`), and every pair is
    /// checked before any is run. An embedding model is refused (`invalid_option`).
    pub async fn rerank(&self, query: &str, documents: &[&str]) -> Result<Ranking, ModelError> {
        if self.info.pooling != Pooling::Rank {
            let reason = format!(
                "this is an embedding model ({} pooling): it embeds texts, it does not rerank them (load a reranker: pooling_type 4)",
                self.info.pooling.as_str()
            );
            return Err(ModelError::InvalidOption { name: "model", reason });
        }
        if documents.is_empty() || documents.len() > MAX_INPUTS {
            let reason = format!("{} documents: 1 to {MAX_INPUTS} per call", documents.len());
            return Err(ModelError::InvalidOption { name: "documents", reason });
        }
        let context = self.context_length();
        let pairs = documents.iter().map(|d| self.rank_tokens(query, d)).collect::<Result<Vec<_>, _>>()?;
        if let Some(long) = pairs.iter().find(|p| p.len() > context) {
            return Err(ModelError::ContextOverflow { needed: long.len(), context });
        }
        let prompt_tokens = pairs.iter().map(Vec::len).sum();
        let run: Vec<Vec<u32>> = pairs.iter().filter(|p| !p.is_empty()).cloned().collect();
        let mut outputs = self.run_packed(run).await?.into_iter();
        let scores = pairs
            .iter()
            .map(|p| {
                if p.is_empty() {
                    return 0.0;
                }
                // node-llama-cpp: the head's first value through a sigmoid (the qwen3 rerankers
                // it leaves as they are are decoders, which never rank here).
                outputs.next().and_then(|o| o.first().copied()).map_or(0.0, sigmoid)
            })
            .collect();
        Ok(Ranking { scores, prompt_tokens })
    }

    /// The pooled outputs of `inputs` in order, run in passes of about `TOKENS_PER_PASS` tokens.
    async fn run_packed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut outputs = Vec::with_capacity(inputs.len());
        let mut pass: Vec<Vec<u32>> = Vec::new();
        let mut pass_tokens = 0;
        for t in inputs {
            if !pass.is_empty() && pass_tokens + t.len() > TOKENS_PER_PASS {
                outputs.extend(self.run(&std::mem::take(&mut pass)).await?);
                pass_tokens = 0;
            }
            pass_tokens += t.len();
            pass.push(t);
        }
        if !pass.is_empty() {
            outputs.extend(self.run(&pass).await?);
        }
        Ok(outputs)
    }

    async fn run(&self, pass: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        match &self.pass {
            Pass::Encoder(e) => Ok(kestrel_cpu::on_pool(|| e.embed(pass))),
            Pass::GpuEncoder(e) => e.embed(pass).await,
            Pass::Decoder(d) => d.embed(pass).await,
        }
    }
}

/// What an encoder is.
fn encoder_info(c: &EncoderConfig) -> EmbedderInfo {
    EmbedderInfo {
        arch: c.arch.name(),
        name: c.name.clone(),
        n_layers: c.n_layers,
        hidden: c.hidden,
        n_heads: c.n_heads,
        vocab: c.vocab,
        train_context: c.train_context,
        pooling: c.pooling,
        context_length: c.train_context,
    }
}

/// What a model of `pooling` does: "reranker" or "embedding".
pub(crate) fn kind(pooling: Pooling) -> &'static str {
    if pooling == Pooling::Rank {
        "reranker"
    } else {
        "embedding"
    }
}

/// The logistic function, in f64 as node-llama-cpp computes it in JavaScript.
fn sigmoid(logit: f32) -> f32 {
    (1.0 / (1.0 + (-f64::from(logit)).exp())) as f32
}

/// Scales `v` to unit length (a zero vector stays zero).
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}
