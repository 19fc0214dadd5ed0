//! `kestrel serve`: the OpenAI-compatible local server (`kestrel-server`) over one model, a chat
//! model or an embedding model.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kestrel_model::LoadedModel;
use kestrel_server::ServerConfig;

use super::load::{load_any, CacheArgs};
use super::speculative::SpeculativeArgs;
use super::CliResult;

#[derive(Args)]
pub struct ServeArgs {
    /// The GGUF file (default: the default model): a chat model serves the completions
    /// endpoints, an embedding model (bert, nomic-bert) /v1/embeddings.
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// Address to listen on. Only this machine can connect unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Require `Authorization: Bearer KEY` on every request but /health (default: the
    /// KESTREL_API_KEY environment variable, else none).
    #[arg(long, env = "KESTREL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests generated at once, batched into one pass of the model per token, each with a KV
    /// cache of --context tokens (1 to 16; a request running alone on the GPU has its tokens
    /// sampled on the device, several steps ahead).
    #[arg(long, default_value_t = 8)]
    pub slots: usize,
    /// Prompt tokens a batched step runs at most, over all prompts being admitted (1 to 4096):
    /// larger admits long prompts sooner, smaller keeps the running requests' tokens coming.
    #[arg(long, default_value_t = ServerConfig::default().prefill_chunk)]
    pub prefill_chunk: usize,
    /// Requests that may wait while every slot is busy; more get HTTP 429.
    #[arg(long, default_value_t = ServerConfig::default().queue)]
    pub queue: usize,
    /// Size of the exact-response cache for deterministic requests, in MiB (0: off).
    #[arg(long, default_value_t = ServerConfig::default().response_cache_bytes >> 20)]
    pub response_cache_mb: usize,
    /// Largest request body, in MiB.
    #[arg(long, default_value_t = ServerConfig::default().max_body_bytes >> 20)]
    pub max_body_mb: usize,
    /// Seconds running requests may take to finish after SIGINT/SIGTERM before they are aborted.
    #[arg(long, default_value_t = ServerConfig::default().shutdown_grace.as_secs())]
    pub shutdown_grace: u64,
    /// A web page origin (e.g. `https://app.example`) allowed to call the API from the browser
    /// (repeatable; `*` for any). Without it browsers keep other origins' pages from reading
    /// answers.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

pub fn run(args: ServeArgs) -> CliResult {
    let path = crate::model_path::resolve(args.model);
    // Checked first, as the browser's options are: a bad flag fails before the model loads.
    let settings = args.cache.settings(args.slots, Some(args.prefill_chunk))?;
    let speculative = args.speculative.options()?;
    let model = load_any(&path, &args.cache, false, settings.slots)?;
    let draft_model = match (&model, speculative) {
        (LoadedModel::Chat(m), Some(_)) => args.speculative.load_draft(&args.cache, false, settings.slots, m.context_length())?,
        (LoadedModel::Embedding(_), Some(_)) => return Err("--lookup and --draft-model serve chat models only".into()),
        (_, None) => None,
    };
    let serving = match &model {
        LoadedModel::Chat(model) => format!("{} request(s) at once", model.slots()),
        LoadedModel::Embedding(embedder) => format!("embeddings of {} dimensions, one request at a time", embedder.dimensions()),
    };
    let model_name = super::model_name(&path);
    let config = ServerConfig {
        model_name,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        queue: args.queue,
        prefill_chunk: settings.prefill_chunk,
        response_cache_bytes: args.response_cache_mb << 20,
        max_body_bytes: args.max_body_mb << 20,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        cors_origins: args.cors_origins,
        speculative,
        draft_model,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, args.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
        let address = listener.local_addr()?;
        // Tests and scripts read this line for the port.
        eprintln!("kestrel serve: listening on http://{address} (OpenAI API at http://{address}/v1), {serving}");
        kestrel_server::serve(model, config, listener, kestrel_server::shutdown_signal()).await?;
        eprintln!("kestrel serve: stopped");
        Ok(())
    })
}
