//! The WGSL sources, embedded at compile time. One kernel family per file in the repository's
//! top-level `shaders/` (build.rs says where it is: `KESTREL_SHADERS_DIR`); shared helpers (quant block decoding and its loaders, workgroup reductions, the
//! subgroup preamble, activations) are files that others `#include`. The parameter blocks shared
//! with Rust are not files: each is declared once, in Rust, by `kestrel_ops::gpu_struct!`, and a
//! shader includes its WGSL text by the Rust type's name (`#include "StepParams"`): lowercase
//! names are files, CamelCase names are Rust types.

use kestrel_ops::params::PenaltyEntry;

use crate::kernels::attention::AttentionParams;
use crate::kernels::encoder::{EncoderAttentionParams, EncoderRopeParams, GeluParams};
use crate::kernels::layernorm::LayerNormParams;
use crate::kernels::rmsnorm::RmsNormParams;
use crate::kernels::rope::RopeParams;
use crate::kernels::sample::{PenaltyUniform, SampleUniform, TokenMaskUniform};
use crate::kernels::{CopyParams, FmaParams, WeightParams};
use crate::StepParams;

/// Returns the source of the shader file `name` (without the `.wgsl` extension), or the WGSL
/// declaration of the parameter block of Rust type `name`.
pub fn shader_source(name: &str) -> Option<&'static str> {
    SHADERS.iter().chain(PARAMETER_BLOCKS).find(|(n, _)| *n == name).map(|(_, src)| *src)
}

macro_rules! shaders {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!(env!("KESTREL_SHADERS_DIR"), "/", $name, ".wgsl")))),*]
    };
}

const SHADERS: &[(&str, &str)] = shaders![
    "activation",
    "attention",
    "copy",
    "embedding",
    "encoder_attention",
    "encoder_rope",
    "fma",
    "gelu",
    "layernorm",
    "matmul",
    "matvec",
    "penalties",
    "quant",
    "quant_loaders",
    "reduce",
    "rmsnorm",
    "rope",
    "sample",
    "subgroups",
    "token_mask",
];

macro_rules! parameter_blocks {
    ($($ty:ident),* $(,)?) => {
        &[$((stringify!($ty), $ty::WGSL)),*]
    };
}

/// Every `gpu_struct!` a shader reads, by its Rust name.
const PARAMETER_BLOCKS: &[(&str, &str)] = parameter_blocks![
    AttentionParams,
    CopyParams,
    EncoderAttentionParams,
    EncoderRopeParams,
    FmaParams,
    GeluParams,
    LayerNormParams,
    PenaltyEntry,
    PenaltyUniform,
    RmsNormParams,
    RopeParams,
    SampleUniform,
    StepParams,
    TokenMaskUniform,
    WeightParams,
];

#[cfg(test)]
mod tests;
