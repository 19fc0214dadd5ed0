//! `kestrel embed`: the embeddings of texts with an embedding model, printed as OpenAI's
//! embeddings answer (the one `kestrel serve`'s /v1/embeddings sends), so scripts read one shape.

use std::path::PathBuf;

use clap::Args;
use kestrel_engine::embeddings::{not_an_embedding_model, EmbeddingRequest};
use serde_json::json;

use super::load::{architecture, is_embedding, load_embedder, BackendChoice};
use super::{engine_coded, model_name, stdin_lines, CliResult};

#[derive(Args)]
pub struct EmbedArgs {
    /// The texts to embed; none: one text a line from stdin (blank lines are skipped).
    pub texts: Vec<String>,
    /// The embedding model's GGUF file (bert, nomic-bert; default: the default model).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Where the model's layers run: gpu, cpu, or auto (the GPU unless there is none or it is a
    /// software rasterizer, which the CPU backend outruns).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Keep the first N values of each vector, normalized again (models trained for it, such
    /// as nomic-embed); default: all.
    #[arg(long)]
    pub dimensions: Option<usize>,
    /// Cut a text longer than the model's context to it rather than refuse it.
    #[arg(long)]
    pub truncate: bool,
    /// Write each vector as base64 of its little-endian f32 values (OpenAI's
    /// `encoding_format: "base64"`), not as a list of numbers.
    #[arg(long)]
    pub base64: bool,
}

pub fn run(args: EmbedArgs) -> CliResult {
    let path = crate::model_path::resolve(args.model);
    let texts = if args.texts.is_empty() { stdin_lines()? } else { args.texts };
    // Checked before the model loads: a bad option costs no load.
    let mut body = json!({ "input": texts, "encoding_format": if args.base64 { "base64" } else { "float" }, "truncate": args.truncate });
    if let Some(dimensions) = args.dimensions {
        body["dimensions"] = json!(dimensions);
    }
    let request = EmbeddingRequest::parse(body).map_err(|e| engine_coded(&e))?;
    // A chat model is refused from its header, without loading it (a file with no architecture
    // goes on to the load, which names what is wrong with it).
    if let Some(arch) = architecture(&path)?.filter(|arch| !is_embedding(Some(arch))) {
        return Err(engine_coded(&not_an_embedding_model(&arch)).into());
    }
    let embedder = load_embedder(&path, args.backend, false)?;
    let embeddings = pollster::block_on(request.run(&embedder)).map_err(|e| engine_coded(&e))?;
    println!("{}", request.response(&model_name(&path), &embeddings));
    Ok(())
}
