//! What the fuzz targets share: the default model's tokenizer, read once per process.
//!
//! The model is the one `./build.sh setup` fetches into the repository's `models/`;
//! `KESTREL_FUZZ_MODEL` names another GGUF file.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use kestrel_gguf::{GgufHeader, GgufStreamReader};
use kestrel_tokenizer::Tokenizer;

/// The default model, relative to the repository root.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> PathBuf {
    match std::env::var_os("KESTREL_FUZZ_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(DEFAULT_MODEL),
    }
}

/// Reads the model's header (metadata and tensor list) and none of its weights: the file
/// is streamed in chunks only until the stream reader has parsed the header.
fn read_header() -> Result<GgufHeader, String> {
    let path = model_path();
    let what = |e: &dyn std::fmt::Display| format!("{}: {e} (run ./build.sh setup, or set KESTREL_FUZZ_MODEL)", path.display());
    let mut file = File::open(&path).map_err(|e| what(&e))?;
    let mut reader = GgufStreamReader::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if let Some(header) = reader.header() {
            return Ok(header.clone());
        }
        let n = file.read(&mut buf).map_err(|e| what(&e))?;
        if n == 0 {
            return Err(what(&"the file ends inside its header"));
        }
        reader.push(&buf[..n], &mut |_| Ok(())).map_err(|e| what(&e))?;
    }
}

/// The default model's tokenizer, built on first use. A fuzz run without the model is
/// a setup error, so this panics (once, at the first input) rather than fuzz nothing.
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let header = read_header().unwrap_or_else(|e| panic!("fuzz setup: {e}"));
        Tokenizer::from_gguf(&header.metadata).unwrap_or_else(|e| panic!("fuzz setup: the model's tokenizer: {e}"))
    })
}
