//! `kestrel rerank`: how relevant each document is to a query, on a reranker (a cross-encoder
//! GGUF, `pooling_type` 4), printed as the rerank answer `kestrel serve`'s /v1/rerank sends (best
//! first), so scripts read one shape.

use std::path::PathBuf;

use clap::Args;
use kestrel_engine::rerank::{not_a_reranker, RerankRequest};
use serde_json::json;

use super::load::{architecture, is_embedding, load_embedder, BackendChoice};
use super::{engine_coded, model_name, stdin_lines, CliResult};

#[derive(Args)]
pub struct RerankArgs {
    /// The documents to score; none: one document a line from stdin (blank lines are skipped).
    pub documents: Vec<String>,
    /// The query the documents are scored against.
    #[arg(long, short)]
    pub query: String,
    /// The reranker's GGUF file (a bert cross-encoder with pooling_type 4; default: the default
    /// model).
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Where the model's layers run: gpu, cpu, or auto (the GPU unless there is none or it is a
    /// software rasterizer, which the CPU backend outruns).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Keep the N best documents; default: all.
    #[arg(long)]
    pub top_n: Option<usize>,
    /// Give each result its document's text (`document: {text}`).
    #[arg(long)]
    pub return_documents: bool,
}

pub fn run(args: RerankArgs) -> CliResult {
    let path = crate::model_path::resolve(args.model);
    let documents = if args.documents.is_empty() { stdin_lines()? } else { args.documents };
    // Checked before the model loads: a bad option costs no load.
    let mut body = json!({ "query": args.query, "documents": documents, "return_documents": args.return_documents });
    if let Some(top_n) = args.top_n {
        body["top_n"] = json!(top_n);
    }
    let request = RerankRequest::parse(body).map_err(|e| engine_coded(&e))?;
    // A chat model is refused from its header, without loading it (an embedding model loads,
    // and the rerank says it is not a reranker).
    if let Some(arch) = architecture(&path)?.filter(|arch| !is_embedding(Some(arch))) {
        return Err(engine_coded(&not_a_reranker(&arch)).into());
    }
    let reranker = load_embedder(&path, args.backend, false)?;
    let ranking = pollster::block_on(request.run(&reranker)).map_err(|e| engine_coded(&e))?;
    println!("{}", request.response(&model_name(&path), &ranking));
    Ok(())
}
