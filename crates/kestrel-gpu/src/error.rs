use thiserror::Error;

/// Everything the GPU runtime can fail with. Messages name the limit, kernel or buffer involved.
#[derive(Debug, Error)]
pub enum GpuError {
    #[error("no WebGPU adapter available: {0}")]
    NoAdapter(String),
    #[error("could not create the GPU device: {0}")]
    DeviceRequest(String),
    #[error("device limit exceeded: {what} needs {needed} bytes, the adapter allows {limit}")]
    Limit { what: String, needed: u64, limit: u64 },
    #[error("shader `{name}` failed to compile: {message}")]
    Shader { name: String, message: String },
    #[error("shader preprocessor, in `{name}` line {line}: {message}")]
    Preprocess { name: String, line: usize, message: String },
    #[error("unknown shader `{0}`")]
    UnknownShader(String),
    #[error("GPU readback failed: {0}")]
    Readback(String),
    #[error("unsupported weight type {0} on the GPU")]
    UnsupportedWeights(String),
    #[error("invalid kernel arguments: {0}")]
    InvalidArgs(String),
    #[error("the GPU device was lost ({0}); load the model again")]
    DeviceLost(String),
    #[error("the GPU is out of memory: {0}")]
    OutOfMemory(String),
    #[error("GPU error: {0}")]
    Device(String),
    #[error(transparent)]
    Weights(#[from] kestrel_gguf::GgufError),
}
