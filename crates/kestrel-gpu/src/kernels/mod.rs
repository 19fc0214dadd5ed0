//! The WGSL kernels, each wrapped as a Rust type that compiles its pipelines at construction
//! (model load) and hands out [`crate::Dispatch`]es whose bind groups are built once.

mod copy;

pub mod attention;
pub mod embedding;
pub mod matmul;
pub mod matvec;
pub mod rmsnorm;
pub mod rope;
pub mod sample;

pub use copy::CopyKernel;
