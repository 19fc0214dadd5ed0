//! A deliberately tiny WGSL preprocessor. WGSL override constants cannot add or remove an
//! `enable subgroups;` directive or swap the block decoder of a weight type, and WGSL functions
//! cannot take a storage buffer as an argument, so kernels are specialized textually with these
//! constructs:
//!
//! - `#include "name"` inlines another file of `shaders/`, or the WGSL of a parameter block
//!   declared in Rust (`shader_source`), once (later includes of it are no-ops),
//! - `#include "name" KEY=VALUE ...` inlines it with those defines added for that file and what
//!   it includes (they shadow the caller's), once per distinct set of arguments: one text
//!   instantiated for several buffers, e.g. the weight loaders of `w` and of `w_up`,
//! - `#if COND` / `#elif COND` / `#else` / `#endif` keep or drop lines, where COND is `NAME` (true
//!   when defined and not "0" or "false") or `!NAME`; the first true branch of a chain is kept,
//! - `{{NAME}}` is replaced by the define's value.
//!
//! Any other line starting with `#` is an error (WGSL itself never starts a line with `#`). The
//! defines are part of the pipeline cache key, so every specialization compiles once.

use std::collections::{BTreeMap, BTreeSet};

use crate::{shader_source, GpuError};

/// Preprocessor defines, ordered so that they form a stable cache key.
pub type Defines = BTreeMap<String, String>;

/// Expands `#include`, `#if` and `{{NAME}}` in the shader file `name`.
pub fn preprocess(name: &str, defines: &Defines) -> Result<String, GpuError> {
    preprocess_from(&shader_source, name, defines)
}

/// Source of a shader file by name: `shader_source`, or test files.
type Sources<'a> = &'a dyn Fn(&str) -> Option<&'static str>;

fn preprocess_from(sources: Sources, name: &str, defines: &Defines) -> Result<String, GpuError> {
    let mut out = String::new();
    let mut included = BTreeSet::new();
    expand(sources, name, &Defines::new(), defines, &mut included, &mut out)?;
    Ok(out)
}

/// One open `#if` chain.
struct Branch {
    /// Every enclosing chain keeps its current branch.
    outer_on: bool,
    /// The current branch is kept.
    on: bool,
    /// Some branch of the chain so far was true.
    taken: bool,
    /// `#else` has been seen.
    in_else: bool,
}

/// Expands file `name`, included with arguments `args` (empty at the top and for plain includes).
fn expand(
    sources: Sources,
    name: &str,
    args: &Defines,
    defines: &Defines,
    included: &mut BTreeSet<String>,
    out: &mut String,
) -> Result<(), GpuError> {
    let instance = args.iter().fold(name.to_string(), |key, (k, v)| format!("{key} {k}={v}"));
    if !included.insert(instance) {
        return Ok(());
    }
    let source = sources(name).ok_or_else(|| GpuError::UnknownShader(name.to_string()))?;
    let err = |line: usize, message: String| GpuError::Preprocess { name: name.to_string(), line, message };
    let mut scoped;
    let defines = if args.is_empty() {
        defines
    } else {
        scoped = defines.clone();
        scoped.extend(args.iter().map(|(k, v)| (k.clone(), v.clone())));
        &scoped
    };
    let mut stack: Vec<Branch> = Vec::new();
    let active = |stack: &[Branch]| stack.last().is_none_or(|b| b.outer_on && b.on);
    for (i, line) in source.lines().enumerate() {
        let lineno = i + 1;
        let trimmed = line.trim();
        if !trimmed.starts_with('#') {
            if active(&stack) {
                out.push_str(&substitute(line, defines).map_err(|m| err(lineno, m))?);
                out.push('\n');
            }
            continue;
        }
        let (directive, rest) = trimmed.split_once(char::is_whitespace).unwrap_or((trimmed, ""));
        let rest = rest.trim();
        match directive {
            "#if" => {
                let on = condition(defines, rest).map_err(|m| err(lineno, m))?;
                stack.push(Branch { outer_on: active(&stack), on, taken: on, in_else: false });
            }
            "#elif" => {
                let top = stack.last_mut().ok_or_else(|| err(lineno, "#elif without #if".into()))?;
                if top.in_else {
                    return Err(err(lineno, "#elif after #else".into()));
                }
                let cond = condition(defines, rest).map_err(|m| err(lineno, m))?;
                top.on = !top.taken && cond;
                top.taken |= top.on;
            }
            "#else" | "#endif" if !rest.is_empty() => return Err(err(lineno, format!("unexpected text after {directive}"))),
            "#else" => {
                let top = stack.last_mut().ok_or_else(|| err(lineno, "#else without #if".into()))?;
                if top.in_else {
                    return Err(err(lineno, "#else after #else".into()));
                }
                top.on = !top.taken;
                top.taken = true;
                top.in_else = true;
            }
            "#endif" => {
                stack.pop().ok_or_else(|| err(lineno, "#endif without #if".into()))?;
            }
            "#include" => {
                let (target, include_args) = include_line(rest).map_err(|m| err(lineno, m))?;
                if active(&stack) {
                    expand(sources, target, &include_args, defines, included, out)?;
                }
            }
            _ => return Err(err(lineno, format!("unknown directive {directive}"))),
        }
    }
    if !stack.is_empty() {
        return Err(err(source.lines().count(), "unterminated #if".into()));
    }
    Ok(())
}

/// Evaluates `NAME` or `!NAME`.
fn condition(defines: &Defines, cond: &str) -> Result<bool, String> {
    let (negated, name) = match cond.strip_prefix('!') {
        Some(name) => (true, name.trim_start()),
        None => (false, cond),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("expected NAME or !NAME, found `{cond}`"));
    }
    Ok(is_true(defines, name) != negated)
}

/// Parses `"name" KEY=VALUE ...` (the part of an `#include` line after the directive).
fn include_line(rest: &str) -> Result<(&str, Defines), String> {
    let bad = || format!("expected #include \"name\" KEY=VALUE ..., found `{rest}`");
    let quoted = rest.strip_prefix('"').ok_or_else(bad)?;
    let (target, args) = quoted.split_once('"').ok_or_else(bad)?;
    let mut parsed = Defines::new();
    for arg in args.split_whitespace() {
        match arg.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                parsed.insert(key.to_string(), value.to_string());
            }
            _ => return Err(bad()),
        }
    }
    Ok((target, parsed))
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

    /// Preprocesses `main` of the given (name, source) files with the defines `on` set to "1".
    fn run(files: &[(&'static str, &'static str)], on: &[&str]) -> Result<String, GpuError> {
        let lookup = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, src)| *src);
        let defines = on.iter().map(|n| (n.to_string(), "1".to_string())).collect();
        preprocess_from(&lookup, "main", &defines)
    }

    fn lines(out: &str) -> Vec<&str> {
        out.lines().map(str::trim).collect()
    }

    const CHAIN: &str = "#if A\na\n#elif !B\nnot_b\n#elif C\nc\n#else\nnone\n#endif\nend";

    #[test]
    fn elif_chain_keeps_the_first_true_branch() {
        assert_eq!(lines(&run(&[("main", CHAIN)], &["A", "C"]).unwrap()), ["a", "end"]);
        assert_eq!(lines(&run(&[("main", CHAIN)], &[]).unwrap()), ["not_b", "end"]);
        assert_eq!(lines(&run(&[("main", CHAIN)], &["B", "C"]).unwrap()), ["c", "end"]);
        assert_eq!(lines(&run(&[("main", CHAIN)], &["B"]).unwrap()), ["none", "end"]);
    }

    #[test]
    fn negation_and_zero_and_false_are_false() {
        let src = "#if !X\nno_x\n#else\nx\n#endif";
        assert_eq!(lines(&run(&[("main", src)], &[]).unwrap()), ["no_x"]);
        assert_eq!(lines(&run(&[("main", src)], &["X"]).unwrap()), ["x"]);
        for off in ["0", "false"] {
            let defines = Defines::from([("X".to_string(), off.to_string())]);
            let lookup = |_: &str| Some(src);
            assert_eq!(lines(&preprocess_from(&lookup, "main", &defines).unwrap()), ["no_x"]);
        }
    }

    #[test]
    fn nested_chains_inside_dropped_branches_stay_dropped() {
        let src = "#if A\n#if !B\nab\n#elif C\nac\n#else\nanot\n#endif\n#elif D\n#if !E\nd\n#endif\n#else\nelse\n#endif";
        let files = [("main", src)];
        assert_eq!(lines(&run(&files, &["A"]).unwrap()), ["ab"]);
        assert_eq!(lines(&run(&files, &["A", "B", "C"]).unwrap()), ["ac"]);
        assert_eq!(lines(&run(&files, &["A", "B"]).unwrap()), ["anot"]);
        assert_eq!(lines(&run(&files, &["D"]).unwrap()), ["d"]);
        assert_eq!(lines(&run(&files, &["D", "E"]).unwrap()), Vec::<&str>::new());
        assert_eq!(lines(&run(&files, &["E"]).unwrap()), ["else"]);
    }

    #[test]
    fn rejects_misplaced_and_malformed_directives() {
        let line_of = |src: &'static str| match run(&[("main", src)], &[]) {
            Err(GpuError::Preprocess { line, message, .. }) => (line, message),
            other => panic!("{src:?}: expected an error, got {other:?}"),
        };
        assert_eq!(line_of("#if A\n#else\n#elif B\n#endif"), (3, "#elif after #else".into()));
        assert_eq!(line_of("#if A\n#else\n#else\n#endif"), (3, "#else after #else".into()));
        assert_eq!(line_of("x\n#elif B\n#endif"), (2, "#elif without #if".into()));
        assert_eq!(line_of("#else\n#endif"), (1, "#else without #if".into()));
        assert_eq!(line_of("#endif"), (1, "#endif without #if".into()));
        assert_eq!(line_of("#if A\nx").1, "unterminated #if");
        assert!(line_of("#if A B\n#endif").1.starts_with("expected NAME"));
        assert!(line_of("#if\n#endif").1.starts_with("expected NAME"));
        assert!(line_of("#if !\n#endif").1.starts_with("expected NAME"));
        assert_eq!(line_of("#ifdef A\n"), (1, "unknown directive #ifdef".into()));
        assert_eq!(line_of("#if A\n#endif A"), (2, "unexpected text after #endif".into()));
    }

    #[test]
    fn include_with_arguments_instantiates_once_per_argument_set() {
        let files = [
            ("main", "#include \"f\" BUF=w NAME=load\n#include \"f\" BUF=up NAME=load_up\n#include \"f\" NAME=load BUF=w\n{{BUF}}"),
            ("f", "fn {{NAME}}() -> u32 { return {{BUF}}[0]; }\n#if UP\nup\n#endif"),
        ];
        let defines = Defines::from([("BUF".to_string(), "outer".to_string())]);
        let lookup = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, src)| *src);
        let out = preprocess_from(&lookup, "main", &defines).unwrap();
        // The arguments shadow the caller's defines in the included file only.
        assert_eq!(lines(&out), ["fn load() -> u32 { return w[0]; }", "fn load_up() -> u32 { return up[0]; }", "outer"]);
        // Arguments are defines, also for #if.
        let files = [("main", "#include \"f\" UP=1"), ("f", "#if UP\nup\n#endif")];
        assert_eq!(lines(&run(&files, &[]).unwrap()), ["up"]);
    }

    #[test]
    fn rejects_malformed_includes() {
        for src in ["#include f", "#include \"f", "#include \"f\" X", "#include \"f\" =1"] {
            let result = run(&[("main", src), ("f", "")], &[]);
            assert!(matches!(result, Err(GpuError::Preprocess { line: 1, .. })), "{src:?}: {result:?}");
        }
    }

    #[test]
    fn copy_shader_expands_unchanged() {
        let src = preprocess("copy", &Defines::new()).unwrap();
        assert!(src.contains("dst[i] = src[i];"));
        assert!(matches!(preprocess("missing", &Defines::new()), Err(GpuError::UnknownShader(_))));
    }
}
