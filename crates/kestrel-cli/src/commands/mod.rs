pub mod bench;
pub mod chat;
pub mod embed;
pub mod generate;
pub mod inspect;
mod load;
pub mod quantize;
pub mod rerank;
pub mod serve;
mod speculative;
pub mod split;
pub mod tokenize;

/// Errors of the CLI are shown to a person: a message is all they need.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// A model error as the CLI shows it: the message, then its stable code in brackets.
pub fn coded(e: kestrel_model::ModelError) -> String {
    format!("{e} [{}]", e.code())
}

/// An engine error as the CLI shows it, as `coded` shows a model error.
pub fn engine_coded(e: &kestrel_engine::EngineError) -> String {
    format!("{e} [{}]", e.code)
}

/// The name answers give a model loaded from `path`: its file name without the extension.
pub fn model_name(path: &std::path::Path) -> String {
    path.file_stem().map_or_else(|| "kestrel".into(), |s| s.to_string_lossy().into_owned())
}

/// The lines of stdin, blank ones skipped: `kestrel embed`'s texts, `kestrel rerank`'s documents.
pub fn stdin_lines() -> Result<Vec<String>, std::io::Error> {
    use std::io::BufRead;
    let mut lines = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if !line.trim().is_empty() {
            lines.push(line);
        }
    }
    Ok(lines)
}
