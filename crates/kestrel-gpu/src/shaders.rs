//! The WGSL sources, embedded at compile time. One kernel family per file in `shaders/`; shared
//! helpers (quant block decoding and its loaders, workgroup reductions, the subgroup preamble,
//! activations, the step uniform) are files that others `#include`.

/// Returns the source of the shader file `name` (without the `.wgsl` extension).
pub fn shader_source(name: &str) -> Option<&'static str> {
    SHADERS.iter().find(|(n, _)| *n == name).map(|(_, src)| *src)
}

macro_rules! shaders {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../shaders/", $name, ".wgsl")))),*]
    };
}

const SHADERS: &[(&str, &str)] = shaders![
    "activation",
    "attention",
    "copy",
    "embedding",
    "fma",
    "matmul",
    "matvec",
    "penalties",
    "quant",
    "quant_loaders",
    "reduce",
    "rmsnorm",
    "rope",
    "sample",
    "step",
    "subgroups",
];
