//! Embedding models: encoders (`bert`, `nomic-bert`) read from GGUF as llama.cpp reads them, and
//! decoders with a pooling type (Qwen3-Embedding), run on the CPU backend's kernels, and the
//! `Embedder` that turns texts into pooled, normalized vectors.

mod config;
mod decoder;
mod forward;
mod gelu;
mod loading;
mod weights;

pub use config::{EncoderArch, EncoderConfig, Pooling};
pub use decoder::{decoder_pooling, DecoderEmbedder};
pub use forward::{Encoder, EncoderTensors};
pub(crate) use loading::EncoderLoading;
pub use weights::{check_complete, check_shape, expected_tensors, EncoderTensor, Kind};

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
    /// An input longer than the model's context is cut to it (keeping its closing [SEP]) rather
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

/// The pass that embeds. The decoder's (the chat graph's, 800 bytes) is boxed so that an
/// `Embedder` stays about a chat `Model`'s size, which `LoadedModel` holds inline; the encoder's
/// stays inline, as it was.
#[allow(clippy::large_enum_variant)]
enum Pass {
    Encoder(Encoder<Quantized>),
    Decoder(Box<DecoderEmbedder>),
}

/// An embedding model on the CPU backend with its tokenizer.
pub struct Embedder {
    info: EmbedderInfo,
    pass: Pass,
    tokenizer: Tokenizer,
}

impl Embedder {
    pub fn new(encoder: Encoder<Quantized>, tokenizer: Tokenizer) -> Self {
        let c = &encoder.config;
        let info = EmbedderInfo {
            arch: c.arch.name(),
            name: c.name.clone(),
            n_layers: c.n_layers,
            hidden: c.hidden,
            n_heads: c.n_heads,
            vocab: c.vocab,
            train_context: c.train_context,
            pooling: c.pooling,
            context_length: c.train_context,
        };
        Self { info, pass: Pass::Encoder(encoder), tokenizer }
    }

    /// A decoder embedding model (Qwen3-Embedding).
    pub fn decoder(decoder: DecoderEmbedder, tokenizer: Tokenizer) -> Self {
        Self { info: decoder.info().clone(), pass: Pass::Decoder(Box::new(decoder)), tokenizer }
    }

    pub fn config(&self) -> &EmbedderInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
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
            Pass::Decoder(d) => d.weight_bytes(),
        }
    }

    /// The token ids `input` is embedded from: a text with the model's special tokens added as
    /// llama.cpp's embedding contexts add them ([CLS] ... [SEP]; a decoder's BOS and EOS where
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
    pub fn embed(&self, inputs: &[EmbedInput<'_>], options: &EmbedOptions) -> Result<Embeddings, ModelError> {
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
        let mut vectors = Vec::with_capacity(tokens.len());
        let mut pass: Vec<Vec<u32>> = Vec::new();
        let mut pass_tokens = 0;
        for t in tokens {
            if !pass.is_empty() && pass_tokens + t.len() > TOKENS_PER_PASS {
                vectors.extend(self.run(&std::mem::take(&mut pass))?);
                pass_tokens = 0;
            }
            pass_tokens += t.len();
            pass.push(t);
        }
        if !pass.is_empty() {
            vectors.extend(self.run(&pass)?);
        }
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

    fn run(&self, pass: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        match &self.pass {
            Pass::Encoder(e) => Ok(kestrel_cpu::on_pool(|| e.embed(pass))),
            Pass::Decoder(d) => kestrel_cpu::on_pool(|| d.embed(pass)),
        }
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}
