//! The WGSL kernels, each wrapped as a Rust type that compiles its pipelines at construction
//! (model load) and hands out [`crate::Dispatch`]es whose bind groups are built once.

mod copy;
mod fma;

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
pub use weights::{Epilogue, OutputColumns};

// The shaders' `#include` reads these parameter blocks' WGSL (`crate::shaders`).
pub(crate) use copy::CopyParams;
pub(crate) use weights::WeightParams;

use crate::GpuError;

/// A model constant baked into a kernel as a WGSL float literal (a `{{NAME}}` define): Rust's
/// shortest round-trip form, which WGSL reads back to the same f32. Finite and positive only.
pub(crate) fn float_define(kernel: &str, what: &str, v: f32) -> Result<String, GpuError> {
    if v.is_finite() && v > 0.0 {
        Ok(format!("{v:?}"))
    } else {
        Err(GpuError::InvalidArgs(format!("{kernel}: {what} {v} must be finite and > 0")))
    }
}
