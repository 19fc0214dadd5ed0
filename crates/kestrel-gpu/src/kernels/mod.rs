//! The WGSL kernels, each wrapped as a Rust type that compiles its pipelines at construction
//! (model load) and hands out [`crate::Dispatch`]es whose bind groups are built once.

mod bindings;
mod copy;
mod fma;
mod operands;
mod token_dispatch;

pub mod attention;
pub mod embedding;
pub mod encoder;
pub mod layernorm;
pub mod matmul;
pub mod matvec;
pub mod rmsnorm;
pub mod rope;
pub mod sample;
mod weights;

pub use copy::CopyKernel;
pub use fma::{FmaKernel, FmaParams};
pub use operands::{GateUpOperands, Operands, OutputColumns};
pub use token_dispatch::TokenDispatch;
pub use weights::Epilogue;

// The shaders' `#include` reads these parameter blocks' WGSL (`crate::shaders`).
pub(crate) use copy::CopyParams;
pub(crate) use weights::WeightParams;

use bindings::Bindings;

use crate::{DType, GpuError, Tensor};

/// The checks of a norm over the rows of `x` (RMSNorm, LayerNorm): `x`, each of `vectors` (its
/// per-column weight, bias) and `out` are f32, every vector holds a row's values, `out` is
/// another buffer of `x`'s shape, and `eps` is finite and >= 0. Returns the row length.
pub(crate) fn check_row_norm(kernel: &str, x: &Tensor, vectors: &[(&str, &Tensor)], out: &Tensor, eps: f32) -> Result<usize, GpuError> {
    let invalid = |why: String| Err(GpuError::InvalidArgs(format!("{kernel}: {why}")));
    let n = x.shape.last().copied().unwrap_or(0);
    if x.dtype != DType::F32 || out.dtype != DType::F32 || vectors.iter().any(|(_, v)| v.dtype != DType::F32) {
        return invalid("x, its vectors and out must be f32".into());
    }
    if n == 0 || x.is_empty() {
        return invalid(format!("x has shape {:?}", x.shape));
    }
    if let Some((name, v)) = vectors.iter().find(|(_, v)| v.len() != n) {
        return invalid(format!("{name} has {} values, rows have {n}", v.len()));
    }
    if out.shape != x.shape || out.buffer == x.buffer {
        return invalid(format!("out ({:?}) must be another buffer of x's shape {:?}", out.shape, x.shape));
    }
    check_eps(kernel, eps)?;
    Ok(n)
}

/// A norm's epsilon: finite and >= 0.
pub(crate) fn check_eps(kernel: &str, eps: f32) -> Result<(), GpuError> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(GpuError::InvalidArgs(format!("{kernel}: eps {eps} must be finite and >= 0")))
    }
}

/// A model constant baked into a kernel as a WGSL float literal (a `{{NAME}}` define): Rust's
/// shortest round-trip form, which WGSL reads back to the same f32. Finite and positive only.
pub(crate) fn float_define(kernel: &str, what: &str, v: f32) -> Result<String, GpuError> {
    if v.is_finite() && v > 0.0 {
        Ok(format!("{v:?}"))
    } else {
        Err(GpuError::InvalidArgs(format!("{kernel}: {what} {v} must be finite and > 0")))
    }
}
