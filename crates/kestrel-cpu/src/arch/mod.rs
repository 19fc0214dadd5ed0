//! The SIMD kernels, one module per architecture (as ggml-cpu's `arch/`): x86-64's AVX2 (with
//! AVX-VNNI and AVX512-VNNI where the CPU has them, detected at run time) and wasm's simd128.
//! The portable code beside `arch` chooses among them and is their reference.

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod wasm;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
