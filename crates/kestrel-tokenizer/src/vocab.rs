//! The tokenizer description stored in a GGUF file's `tokenizer.*` metadata.

/// `tokenizer.ggml.model`: which tokenization algorithm the vocabulary is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabularyModel {
    /// `gpt2`: byte-level BPE with merges (GPT-2, Llama 3, Qwen, SmolLM, ...).
    Gpt2,
    /// `llama`: SentencePiece BPE with scores and `<0xXX>` byte fallback (Llama 2, TinyLlama, Mistral v0.1).
    Llama,
    /// `bert`: WordPiece (BERT, MiniLM, nomic-bert), in llama.cpp's phantom-space form: a piece
    /// that starts a word is stored as `▁word`, a continuation (`##ing`) as `ing`.
    Bert,
}

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    /// From the GGUF integer; anything unknown is `Undefined`.
    pub fn from_i32(v: i32) -> Self {
        match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// The special-token ids a vocabulary names (`tokenizer.ggml.*_token_id`), each `None` when absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialTokenIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic): what WordPiece appends with `add_special`.
    pub sep: Option<u32>,
    /// Fill-in-the-middle tokens (`tokenizer.ggml.fim_*_token_id`): prefix, suffix, middle,
    /// pad, repository and file separator. Pad, repository and separator end generation.
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Everything the tokenizer needs, as read from GGUF metadata. Fields are public so
/// that a vocabulary can also be assembled by hand (tests, other containers).
#[derive(Debug, Clone)]
pub struct Vocabulary {
    /// `tokenizer.ggml.model`.
    pub model: VocabularyModel,
    /// `tokenizer.ggml.pre` (byte-level BPE only; `None` means llama.cpp's `default`).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token text by id (byte-level encoded for `gpt2`).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece; empty when absent).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type` (empty when absent: every token is then normal).
    pub token_types: Vec<TokenType>,
    /// `tokenizer.ggml.merges` as `"left right"` strings (byte-level BPE).
    pub merges: Vec<String>,
    /// The special tokens the file names by id.
    pub ids: SpecialTokenIds,
    /// `general.name`: llama.cpp strips the whitespace after special tokens for Phi-3 models
    /// by this name.
    pub model_name: Option<String>,
    /// `tokenizer.ggml.add_bos_token` (`None`: llama.cpp's default for the model/pre).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece; default true).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; default false).
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; default: as `lowercase`).
    pub strip_accents: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl Vocabulary {
    /// The type of token `id` (normal when the GGUF has no type array).
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types.get(id).copied().unwrap_or(TokenType::Normal)
    }
}
