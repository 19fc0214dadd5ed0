//! Where the default model lives when no `--model` is given.

use std::path::{Path, PathBuf};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The given path, else `$KESTREL_MODEL`, else `models/<default>` in the current directory or
/// in the repository the binary was built in (`target/<profile>/kestrel` -> `../../models`).
pub fn resolve(given: Option<PathBuf>) -> PathBuf {
    if let Some(path) = given {
        return path;
    }
    if let Some(path) = std::env::var_os("KESTREL_MODEL") {
        return PathBuf::from(path);
    }
    let local = Path::new("models").join(DEFAULT_MODEL_FILE);
    if local.exists() {
        return local;
    }
    let beside_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent()?.parent().map(|root| root.join("models").join(DEFAULT_MODEL_FILE)));
    match beside_binary {
        Some(path) if path.exists() => path,
        _ => local,
    }
}
