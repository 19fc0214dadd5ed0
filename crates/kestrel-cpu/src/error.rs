use kestrel_gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("{ty} matrices cannot run on the CPU path")]
    UnsupportedType { ty: GgmlType },
    #[error("a {rows} x {cols} matrix: {reason}")]
    Shape { rows: usize, cols: usize, reason: String },
    /// The allocator had no room (in wasm: the instance's memory cannot grow that far).
    #[error("cannot allocate {bytes} bytes for {what}")]
    OutOfMemory { bytes: u64, what: String },
}
