//! Hyper-parameters of an encoder (embedding) model, read from GGUF metadata as llama.cpp reads
//! them for its `bert` and `nomic-bert` graphs (src/models/bert.cpp).

use kestrel_gguf::GgufHeader;

use crate::config::required_count;
use crate::error::{bad_model, ModelError};

/// The encoder architectures Kestrel runs, as GGUF's `general.architecture` spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderArch {
    /// BERT (all-MiniLM, bge, e5): learned absolute positions, Q/K/V with biases, GELU FFN.
    Bert,
    /// nomic-embed-text: fused Q|K|V, NeoX RoPE, SwiGLU FFN, no position table.
    NomicBert,
}

impl EncoderArch {
    pub const NAMES: [&'static str; 2] = ["bert", "nomic-bert"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "bert" => Some(Self::Bert),
            "nomic-bert" => Some(Self::NomicBert),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::NomicBert => "nomic-bert",
        }
    }
}

/// How a sequence's token vectors become one embedding (`{arch}.pooling_type`, llama.cpp's
/// `llama_pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's vector (sentence-transformers' default).
    Mean,
    /// The first token's (`[CLS]`).
    Cls,
    /// The last token's (decoder embedding models).
    Last,
    /// A cross-encoder reranker's: the first token's (`[CLS]`) row through the classifier head
    /// (`cls`, tanh, `cls.output`), whose first value is the pair's relevance logit.
    Rank,
}

impl Pooling {
    /// llama.cpp's numbering; 0 (none: a vector per token) is not an embedding of a whole input
    /// and is refused.
    pub(crate) fn from_gguf(value: u64) -> Result<Self, ModelError> {
        match value {
            1 => Ok(Self::Mean),
            2 => Ok(Self::Cls),
            3 => Ok(Self::Last),
            4 => Ok(Self::Rank),
            0 => Err(ModelError::UnsupportedArch("an encoder with pooling_type 0 (none: one vector per token)".into())),
            v => Err(bad_model(format!("pooling_type {v} is not one of llama.cpp's (0-4)"))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
            Self::Rank => "rank",
        }
    }
}

#[derive(Clone, Debug)]
pub struct EncoderConfig {
    pub arch: EncoderArch,
    pub name: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// Positions the model was trained for: the longest input it embeds.
    pub train_context: usize,
    /// LayerNorm's epsilon.
    pub norm_eps: f32,
    pub pooling: Pooling,
    /// Rows of the token-type table (`tokenizer.ggml.token_type_count`); row 0 is added to every
    /// token, as llama.cpp does ("sentence A").
    pub token_types: usize,
    /// RoPE base (nomic-bert).
    pub rope_base: f32,
    /// Values the classifier head's `cls.output` gives (rank pooling): the length of
    /// `{arch}.classifier.output_labels`, else 1, as llama.cpp's `n_cls_out`.
    pub n_cls_out: usize,
}

impl EncoderConfig {
    /// The encoder a header describes, or None when the file is not an encoder.
    pub fn from_header(header: &GgufHeader) -> Result<Option<Self>, ModelError> {
        let md = &header.metadata;
        let Some(arch_name) = md.get_str("general.architecture")? else { return Ok(None) };
        let Some(arch) = EncoderArch::from_name(arch_name) else { return Ok(None) };
        let key = |k: &str| format!("{arch_name}.{k}");
        let need = |k: &str| required_count(md, &key(k));
        let hidden = need("embedding_length")?;
        let n_heads = need("attention.head_count")?;
        if !hidden.is_multiple_of(n_heads) {
            return Err(bad_model(format!("embedding_length {hidden} is not a multiple of head_count {n_heads}")));
        }
        if md.get_bool(&key("attention.causal"))? == Some(true) {
            return Err(ModelError::UnsupportedArch(format!("{arch_name} with causal attention")));
        }
        let pooling = Pooling::from_gguf(md.get_u64(&key("pooling_type"))?.unwrap_or(1))?;
        if pooling == Pooling::Rank {
            // llama.cpp reads the classifier head (`cls*`) only for bert: a nomic-bert reranker
            // would score its raw [CLS] row there, or fail on the unread tensors.
            if arch != EncoderArch::Bert {
                return Err(ModelError::UnsupportedArch(format!("a {arch_name} reranker (pooling_type 4): only bert rerankers")));
            }
            // node-llama-cpp builds a pair from this template instead of [BOS] query [EOS] [SEP]
            // document [EOS]; Kestrel builds only the latter.
            if md.get_str("tokenizer.chat_template.rerank")?.is_some() {
                return Err(ModelError::UnsupportedArch("a reranker with a tokenizer.chat_template.rerank template".into()));
            }
        }
        let n_cls_out = match md.get_string_array(&key("classifier.output_labels"))? {
            Some(labels) if !labels.is_empty() => labels.len(),
            _ => 1,
        };
        let norm_eps = md.get_f32(&key("attention.layer_norm_epsilon"))?.unwrap_or(1e-12);
        let rope_base = md.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        if !(norm_eps.is_finite() && norm_eps > 0.0 && rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad_model(format!("layer_norm_epsilon {norm_eps} / rope.freq_base {rope_base} out of range")));
        }
        let vocab = md
            .get_string_array("tokenizer.ggml.tokens")?
            .map(|t| t.len())
            .filter(|&n| n > 0)
            .ok_or_else(|| bad_model("no tokenizer.ggml.tokens"))?;
        // llama.cpp refuses a BERT without token types (its load asserts the count is positive).
        let token_types = match md.get_u64("tokenizer.ggml.token_type_count")? {
            Some(n) => usize::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| bad_model(format!("token_type_count {n}")))?,
            None => return Err(bad_model("missing tokenizer.ggml.token_type_count")),
        };
        Ok(Some(Self {
            arch,
            name: md.get_str("general.name")?.unwrap_or(arch_name).to_string(),
            n_layers: need("block_count")?,
            hidden,
            ffn: need("feed_forward_length")?,
            n_heads,
            head_dim: hidden / n_heads,
            vocab,
            train_context: need("context_length")?,
            norm_eps,
            pooling,
            token_types,
            rope_base,
            n_cls_out,
        }))
    }
}
