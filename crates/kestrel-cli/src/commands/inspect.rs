use std::collections::BTreeMap;
use std::path::Path;

use kestrel_gguf::{GgmlType, MetadataValue};

use super::CliResult;

pub fn run(path: &Path, all_tensors: bool) -> CliResult {
    let header = read_header(path)?;
    println!("file:      {}", path.display());
    println!("version:   {}", header.version);
    println!("alignment: {}", header.alignment);
    println!("metadata ({} keys):", header.metadata.len());
    for (key, value) in header.metadata.iter() {
        println!("  {key:<40} {}", summarize(value));
    }
    let mut by_type: BTreeMap<&str, (GgmlType, usize, u64)> = BTreeMap::new();
    for t in &header.tensors {
        let e = by_type.entry(t.ggml_type.name()).or_insert((t.ggml_type, 0, 0));
        e.1 += 1;
        e.2 += t.n_bytes();
    }
    let total: u64 = header.tensors.iter().map(|t| t.n_bytes()).sum();
    println!("tensors ({}, {:.1} MiB):", header.tensors.len(), total as f64 / (1 << 20) as f64);
    for (name, (ty, n, bytes)) in &by_type {
        let note = if kestrel_gpu::layout::is_gpu_supported(*ty) { "" } else { "  (not supported on the GPU)" };
        println!("  {name:<8} {n:>5} tensors {:>10.1} MiB{note}", *bytes as f64 / (1 << 20) as f64);
    }
    if all_tensors {
        for t in &header.tensors {
            println!("  {:<32} {:<6} {:?}", t.name, t.ggml_type.name(), t.dims);
        }
    }
    Ok(())
}

/// The model's header: its file's, or its shards' merged where `path` names a split model's first
/// shard (`kestrel_gguf::read_model_header`).
pub fn read_header(path: &Path) -> Result<kestrel_gguf::GgufHeader, Box<dyn std::error::Error>> {
    Ok(kestrel_gguf::read_model_header(path)?)
}

fn summarize(value: &MetadataValue) -> String {
    match value {
        MetadataValue::String(s) => {
            let one_line: String = s.chars().take(60).map(|c| if c == '\n' { ' ' } else { c }).collect();
            if s.chars().count() > 60 {
                format!("{one_line:?}...")
            } else {
                format!("{one_line:?}")
            }
        }
        MetadataValue::Array(items) => {
            let head: Vec<String> = items.iter().take(4).map(summarize).collect();
            format!("[{}{}] ({} items)", head.join(", "), if items.len() > 4 { ", ..." } else { "" }, items.len())
        }
        other => format!("{other:?}"),
    }
}
