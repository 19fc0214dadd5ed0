//! The parameter blocks have one definition: no shader file declares one by hand, every block a
//! shader binds comes from Rust, and every block Rust declares is read by some shader.

use super::{PARAMETER_BLOCKS, SHADERS};

/// The WGSL name a generated block declares (`struct NAME {` on its first line).
fn declared_name(wgsl: &str) -> &str {
    wgsl.strip_prefix("struct ").and_then(|rest| rest.split_once(' ')).map_or("", |(name, _)| name)
}

/// The struct types of a file's `var` declarations: `var<uniform> params: Params;` gives `Params`,
/// `var<storage, read> entries: array<Entry>;` gives `Entry`. Built-in types (lowercase) and the
/// file's aliases of them (`alias Word4 = vec4<f32>;`) are left out.
fn bound_structs(source: &str) -> Vec<&str> {
    source
        .lines()
        .filter(|line| line.trim_start().starts_with("@group") && line.contains(" var<"))
        .filter_map(|line| line.split_once(": ").map(|(_, ty)| ty.trim().trim_end_matches(';')))
        .map(|ty| ty.strip_prefix("array<").map_or(ty, |inner| inner.trim_end_matches('>')))
        .filter(|ty| ty.starts_with(|c: char| c.is_ascii_uppercase()) && !source.contains(&format!("alias {ty} =")))
        .collect()
}

#[test]
fn shader_files_bind_only_generated_blocks() {
    let generated: Vec<&str> = PARAMETER_BLOCKS.iter().map(|(_, wgsl)| declared_name(wgsl)).collect();
    assert!(generated.iter().all(|name| !name.is_empty()), "{PARAMETER_BLOCKS:?}");
    for (file, source) in SHADERS {
        for name in &generated {
            assert!(!source.contains(&format!("struct {name} {{")), "{file}.wgsl declares `{name}` by hand: include the Rust block");
        }
        for ty in bound_structs(source) {
            assert!(generated.contains(&ty), "{file}.wgsl binds `{ty}`, which no gpu_struct! declares");
        }
    }
}

#[test]
fn every_generated_block_is_included() {
    for (name, _) in PARAMETER_BLOCKS {
        let include = format!("#include \"{name}\"");
        assert!(SHADERS.iter().any(|(_, source)| source.contains(&include)), "no shader includes {name}");
    }
}
