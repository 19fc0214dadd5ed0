//! `kestrel`: run GGUF language models on the GPU from the command line.

mod commands;
mod model_path;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kestrel", version, about = "Run GGUF language models on the GPU (WebGPU / wgpu)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Generate(commands::generate::GenerateArgs),
    /// An interactive chat with the model's chat template.
    Chat(commands::chat::ChatArgs),
    /// A local OpenAI-compatible HTTP server (chat and text completions, streamed or whole,
    /// /v1/embeddings with an embedding model, or /v1/rerank with a reranker; /v1/models,
    /// /health, /metrics).
    Serve(commands::serve::ServeArgs),
    /// Embed texts with an embedding model (bert, nomic-bert): OpenAI's embeddings JSON on
    /// stdout.
    Embed(commands::embed::EmbedArgs),
    /// Score documents against a query with a reranker (a bert cross-encoder, pooling_type 4):
    /// the rerank JSON of /v1/rerank on stdout, best first.
    Rerank(commands::rerank::RerankArgs),
    /// Show a GGUF file's metadata and tensor table.
    Inspect {
        /// The GGUF file (default: the default model).
        #[arg(long, short)]
        model: Option<PathBuf>,
        /// Print every tensor, not only a summary.
        #[arg(long)]
        tensors: bool,
    },
    /// Tokenize text with a model's own vocabulary.
    Tokenize {
        text: String,
        #[arg(long, short)]
        model: Option<PathBuf>,
        /// Print a plain JSON list of ids.
        #[arg(long)]
        json: bool,
        /// Add BOS/EOS as the model's metadata asks.
        #[arg(long)]
        add_special: bool,
    },
    /// Benchmarks: `kestrel bench kernels`, `kestrel bench model`.
    Bench(commands::bench::BenchArgs),
    /// Write a copy of a GGUF model with its weights in another format.
    Quantize {
        input: PathBuf,
        output: PathBuf,
        /// q4_k_m (llama.cpp's mixed recipe), q4_k, q5_k, q6_k, q8_0, q5_0, q5_1, q4_0, q4_1, f16 or f32.
        #[arg(long = "type")]
        ty: String,
    },
    /// Write a model as a split model's shards, as llama.cpp's gguf-split does, for hosts that
    /// cap file sizes: PREFIX-00001-of-0000N.gguf and so on. Every command (and the browser
    /// package) loads a split model from its first shard's name.
    Split {
        input: PathBuf,
        /// The shards' path without its -0000k-of-0000n.gguf ending.
        prefix: String,
        /// The most tensor data a shard holds, e.g. 2G or 500M (a larger tensor gets a shard of
        /// its own).
        #[arg(long, conflicts_with = "max_tensors")]
        max_size: Option<String>,
        /// The most tensors a shard holds (gguf-split's default: 128).
        #[arg(long)]
        max_tensors: Option<usize>,
        /// The first shard holds only the metadata (gguf-split's option of the same name).
        #[arg(long)]
        no_tensor_first_split: bool,
    },
}

fn main() -> ExitCode {
    // Output piped into a reader that stops early (`kestrel inspect | head`) ends the process as
    // it ends other Unix tools, quietly, where Rust's ignored SIGPIPE made `println!` panic.
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Embed(args) => commands::embed::run(args),
        Command::Rerank(args) => commands::rerank::run(args),
        Command::Inspect { model, tensors } => commands::inspect::run(&model_path::resolve(model), tensors),
        Command::Tokenize { text, model, json, add_special } => {
            commands::tokenize::run(&model_path::resolve(model), &text, json, add_special)
        }
        Command::Quantize { input, output, ty } => commands::quantize::run(&input, &output, &ty),
        Command::Split { input, prefix, max_size, max_tensors, no_tensor_first_split } => {
            commands::split::run(&input, &prefix, max_size.as_deref(), max_tensors, no_tensor_first_split)
        }
        Command::Bench(args) => commands::bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
