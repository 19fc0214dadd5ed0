use std::path::Path;

use kestrel_gguf::SplitLimit;

use super::CliResult;

/// gguf-split's default: at most this many tensors a shard.
const DEFAULT_MAX_TENSORS: usize = 128;

pub fn run(input: &Path, prefix: &str, max_size: Option<&str>, max_tensors: Option<usize>, metadata_shard: bool) -> CliResult {
    let limit = match (max_size, max_tensors) {
        (Some(size), _) => SplitLimit::Bytes(parse_size(size)?),
        (None, Some(0)) => return Err("--max-tensors must be at least 1".into()),
        (None, n) => SplitLimit::Tensors(n.unwrap_or(DEFAULT_MAX_TENSORS)),
    };
    let paths = kestrel_gguf::split_model(input, prefix, limit, metadata_shard)?;
    for path in &paths {
        let bytes = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
        println!("wrote {} ({:.1} MiB)", path.display(), bytes as f64 / 1048576.0);
    }
    Ok(())
}

/// `500M`, `2G` (gguf-split's units: 1000^2 and 1000^3 bytes), or a byte count.
fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("--max-size {text:?} is not a size such as 500M or 2G");
    let (digits, unit) = match text.strip_suffix(['M', 'm']) {
        Some(d) => (d, 1_000_000),
        None => match text.strip_suffix(['G', 'g']) {
            Some(d) => (d, 1_000_000_000),
            None => (text, 1),
        },
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(unit).filter(|&b| b > 0).ok_or_else(bad)
}
