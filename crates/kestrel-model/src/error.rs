use thiserror::Error;

/// Everything loading or running a model can fail with. Each variant has a stable `code()` that
/// the CLI prints and the wasm layer hands to JavaScript.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("bad model file: {0}")]
    BadModel(String),
    #[error("unsupported quantization: tensor {tensor:?} has type {ty}, which Kestrel cannot run")]
    UnsupportedQuant { tensor: String, ty: String },
    #[error("unsupported architecture {0:?} (supported: llama, qwen2, qwen3, smollm3, phi3, gemma2, gemma3)")]
    UnsupportedArch(String),
    #[error("the prompt and generation need {needed} tokens but the context holds {context}")]
    ContextOverflow { needed: usize, context: usize },
    #[error("invalid option {name}: {reason}")]
    InvalidOption { name: &'static str, reason: String },
    /// A saved KV prefix that is corrupt or truncated.
    #[error("bad KV prefix snapshot: {0}")]
    BadSnapshot(String),
    /// A saved KV prefix, intact, of another model file or cache setup.
    #[error("the KV prefix snapshot does not fit this model: {0}")]
    SnapshotMismatch(String),
    /// A feature only the GPU backend has, asked of a model on the CPU backend.
    #[error("{0} needs the GPU backend")]
    NeedsGpu(&'static str),
    /// The CPU backend could not allocate a buffer of the model (in the browser: 32-bit wasm
    /// memory cannot grow that far). Nothing is left half-loaded: a smaller model still loads.
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory { what: String, bytes: u64 },
    /// A model that serves one call at a time asked for a second meanwhile.
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The error of a batched step, as each of its sequences gets it.
    #[error("{message}")]
    InBatch { code: &'static str, message: String },
    #[error(transparent)]
    Gguf(#[from] kestrel_gguf::GgufError),
    #[error(transparent)]
    Gpu(#[from] kestrel_gpu::GpuError),
    #[error(transparent)]
    Tokenizer(#[from] kestrel_tokenizer::TokenizerError),
}

impl ModelError {
    /// A stable, machine-readable code for this error.
    pub fn code(&self) -> &'static str {
        use kestrel_gpu::GpuError as G;
        match self {
            // The stream reader could not buffer a tensor: the file may be sound, the memory short.
            Self::OutOfMemory { .. } | Self::Gguf(kestrel_gguf::GgufError::Allocation { .. }) => "out_of_memory",
            Self::BadModel(_) | Self::Gguf(_) | Self::UnsupportedArch(_) => "bad_model",
            Self::UnsupportedQuant { .. } => "unsupported_quant",
            Self::ContextOverflow { .. } => "context_overflow",
            Self::InvalidOption { .. } => "invalid_option",
            Self::BadSnapshot(_) => "bad_snapshot",
            Self::SnapshotMismatch(_) => "snapshot_mismatch",
            Self::NeedsGpu(_) => "needs_gpu",
            Self::Busy(_) => "busy",
            Self::InBatch { code, .. } => code,
            // The model's chat template failed while rendering a request: its own code, so that a
            // page can tell a hostile or broken template from a tokenizer fault.
            Self::Tokenizer(kestrel_tokenizer::TokenizerError::Template(_)) => "template",
            Self::Tokenizer(_) => "tokenizer",
            Self::Gpu(G::NoAdapter(_)) => "no_webgpu",
            Self::Gpu(G::Limit { .. }) | Self::Gpu(G::DeviceRequest(_)) => "device_limits",
            Self::Gpu(G::Weights(_)) => "bad_model",
            Self::Gpu(G::DeviceLost(_)) => "device_lost",
            Self::Gpu(G::OutOfMemory(_)) => "out_of_memory",
            Self::Gpu(G::UnsupportedWeights(_)) => "unsupported_quant",
            Self::Gpu(_) => "gpu",
        }
    }
}

/// A CPU kernel's error: no room for a buffer is `out_of_memory`, the others a bad file.
impl From<kestrel_cpu::CpuError> for ModelError {
    fn from(e: kestrel_cpu::CpuError) -> Self {
        match e {
            kestrel_cpu::CpuError::OutOfMemory { what, bytes } => Self::OutOfMemory { what, bytes },
            other => bad_model(other.to_string()),
        }
    }
}

pub(crate) fn bad_model(msg: impl Into<String>) -> ModelError {
    ModelError::BadModel(msg.into())
}
