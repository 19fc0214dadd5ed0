/// Everything that can go wrong while building or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A GGUF metadata value could not be read (wrong type, bad array...).
    #[error("GGUF metadata: {0}")]
    Metadata(String),
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(&'static str),
    /// `tokenizer.ggml.model` names a tokenizer kind this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (tokenizer.ggml.model); supported: gpt2 (byte-level BPE), llama (SentencePiece BPE), bert (WordPiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unsupported pre-tokenizer `{0}` (tokenizer.ggml.pre); supported: {supported}", supported = crate::pre::SUPPORTED_PRE_NAMES.join(", "))]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (bad merge, wrong array length, ...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocabulary(String),
    /// A token id outside the vocabulary was passed in.
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
    /// The `tokenizers` crate refused to build the tokenizer.
    #[error("building the tokenizer failed: {0}")]
    Build(String),
    /// Encoding text failed.
    #[error("encoding failed: {0}")]
    Encode(String),
    /// A Hugging Face `tokenizer.json` could not be used.
    #[error("tokenizer.json: {0}")]
    Json(String),
    /// The chat template failed to compile or render (including `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
}

/// Result with [`TokenizerError`].
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
