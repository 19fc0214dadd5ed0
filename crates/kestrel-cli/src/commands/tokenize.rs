use std::path::Path;

use kestrel_tokenizer::Tokenizer;

use super::{inspect::read_header, CliResult};

pub fn run(path: &Path, text: &str, json: bool, add_special: bool) -> CliResult {
    let header = read_header(path)?;
    let tokenizer = Tokenizer::from_gguf(&header.metadata)?;
    let ids = tokenizer.encode(text, add_special)?;
    if json {
        println!("{}", serde_json::to_string(&ids)?);
        return Ok(());
    }
    for id in &ids {
        let piece = tokenizer.piece(*id).unwrap_or_default();
        println!("{id:>8}  {piece:?}");
    }
    println!("{} tokens", ids.len());
    Ok(())
}
