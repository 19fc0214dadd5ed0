//! CPU kernels for the model graph where there is no real GPU: weights kept as small integers
//! with a scale and an offset per 16 (`kestrel_gguf::quant::int_groups`), activations quantized
//! to 8 bits per block of 32 (as llama.cpp's CPU path does), integer dot products in SIMD (AVX2
//! natively, detected at run time; simd128 in wasm built with it; portable code otherwise), the
//! rows of a product split over a thread pool natively. F16 and F32 matrices stay f32 and
//! multiply f32 activations, as llama.cpp's do.
//!
//! Portable code (layouts, scalar reference kernels, the choice of instruction set) lies at the
//! top; the SIMD kernels of each architecture under `arch`, as ggml-cpu's `arch/x86`,
//! `arch/wasm`.

mod activations;
mod alloc;
mod arch;
mod attention;
mod dot;
mod error;
mod factored;
mod interleaved;
mod matrix;
mod parallel;
mod rows;

pub use alloc::{zeroed, ZeroBits};
pub use attention::{Attention, KvRows};
pub use error::CpuError;
pub use matrix::Matrix;

/// Weights per block of the 8-bit activations (ggml's QK8_0).
pub const ACT_BLOCK: usize = 32;

/// The SIMD instruction set the integer dot products use on this machine.
pub fn simd_name() -> &'static str {
    dot::simd_name()
}

#[cfg(not(target_arch = "wasm32"))]
pub use parallel::copy_bandwidth;
pub use parallel::{for_row_chunks, on_pool};

/// Threads the CPU backend's pool runs (`on_pool`).
pub fn threads() -> usize {
    parallel::threads()
}
