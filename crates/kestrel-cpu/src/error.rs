use kestrel_gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("{ty} matrices cannot run on the CPU path")]
    UnsupportedType { ty: GgmlType },
    #[error("a {rows} x {cols} matrix: {reason}")]
    Shape { rows: usize, cols: usize, reason: String },
}
