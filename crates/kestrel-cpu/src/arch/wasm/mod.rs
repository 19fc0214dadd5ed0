//! wasm's kernels in its 128-bit SIMD, which a wasm build compiled with `+simd128` always has
//! (every browser with WebGPU runs it; `.cargo/config.toml` enables it).

pub(crate) mod dot;
pub(crate) mod lanes;
