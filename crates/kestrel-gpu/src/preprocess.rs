//! A deliberately tiny WGSL preprocessor. WGSL override constants cannot add or remove an
//! `enable subgroups;` directive or swap the block decoder of a weight type, so kernels are
//! specialized textually with exactly four constructs:
//!
//! - `#include "name"` inlines another file of `shaders/` (once; later includes of it are no-ops),
//! - `#if NAME` / `#else` / `#endif` keep or drop lines (NAME is true when defined and not "0"),
//! - `{{NAME}}` is replaced by the define's value.
//!
//! The defines are part of the pipeline cache key, so every specialization compiles once.

use std::collections::{BTreeMap, BTreeSet};

use crate::{shader_source, GpuError};

/// Preprocessor defines, ordered so that they form a stable cache key.
pub type Defines = BTreeMap<String, String>;

/// Expands `#include`, `#if` and `{{NAME}}` in the shader file `name`.
pub fn preprocess(name: &str, defines: &Defines) -> Result<String, GpuError> {
    let mut out = String::new();
    let mut included = BTreeSet::new();
    expand(name, defines, &mut included, &mut out)?;
    Ok(out)
}

fn expand(name: &str, defines: &Defines, included: &mut BTreeSet<String>, out: &mut String) -> Result<(), GpuError> {
    if !included.insert(name.to_string()) {
        return Ok(());
    }
    let source = shader_source(name).ok_or_else(|| GpuError::UnknownShader(name.to_string()))?;
    let err = |line: usize, message: String| GpuError::Preprocess { name: name.to_string(), line, message };
    // Each entry: (this branch is active, some enclosing branch is inactive).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &[(bool, bool)]| stack.last().is_none_or(|&(on, outer_off)| on && !outer_off);
    for (i, line) in source.lines().enumerate() {
        let lineno = i + 1;
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("#if ") {
            let on = is_true(defines, rest.trim());
            let outer_off = !active(&stack);
            stack.push((on, outer_off));
        } else if trimmed.starts_with("#else") {
            let top = stack.last_mut().ok_or_else(|| err(lineno, "#else without #if".into()))?;
            top.0 = !top.0;
        } else if trimmed.starts_with("#endif") {
            stack.pop().ok_or_else(|| err(lineno, "#endif without #if".into()))?;
        } else if let Some(rest) = trimmed.strip_prefix("#include ") {
            if active(&stack) {
                let target = rest.trim().trim_matches('"');
                expand(target, defines, included, out)?;
            }
        } else if active(&stack) {
            out.push_str(&substitute(line, defines).map_err(|m| err(lineno, m))?);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(err(source.lines().count(), "unterminated #if".into()));
    }
    Ok(())
}

fn is_true(defines: &Defines, name: &str) -> bool {
    defines.get(name).is_some_and(|v| v != "0" && v != "false")
}

fn substitute(line: &str, defines: &Defines) -> Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or("unterminated {{")?;
        let key = after[..end].trim();
        let value = defines.get(key).ok_or_else(|| format!("undefined {{{{{key}}}}}"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_and_rejects_undefined() {
        let mut d = Defines::new();
        d.insert("WG".into(), "64".into());
        assert_eq!(substitute("@workgroup_size({{WG}}, 1)", &d).unwrap(), "@workgroup_size(64, 1)");
        assert!(substitute("{{NOPE}}", &d).is_err());
        assert!(substitute("{{WG", &d).is_err());
    }

    #[test]
    fn copy_shader_expands_unchanged() {
        let src = preprocess("copy", &Defines::new()).unwrap();
        assert!(src.contains("dst[i] = src[i];"));
        assert!(matches!(preprocess("missing", &Defines::new()), Err(GpuError::UnknownShader(_))));
    }
}
