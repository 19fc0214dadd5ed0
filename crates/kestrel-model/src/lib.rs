//! Llama-family language models, the network alone: configuration from GGUF metadata, weights
//! streamed to the GPU or the CPU backend as they arrive, the decode/prefill graph, the CPU
//! forward pass, the forward passes over KV slots that generation drives (`forward`), KV prefix
//! snapshots, the will-it-fit estimate, and the encoders of embedding models. What a request
//! does with them is `kestrel-engine`'s.

pub mod config;
mod cpu_backend;
pub mod cpu_forward;
pub mod encoder;
mod error;
pub mod estimate;
mod forward;
mod graph;
mod load;
mod model;
mod pacing;
mod pending_tokenizer;
pub mod prefix_snapshot;
pub mod reference;
pub mod synthetic;
pub mod tensors;

pub use config::{Arch, GateActivation, ModelConfig};
pub use cpu_backend::CpuModel;
pub use encoder::{EmbedInput, EmbedOptions, Embedder, EmbedderInfo, Embeddings, Ranking};
pub use error::ModelError;
pub use forward::{BatchRow, DecodeInput, RowOutput};
pub use graph::{BatchSample, KernelFamily, StepHostTime, StepOutput, MAX_LOGIT_BIAS, MAX_PENALTY_WINDOW, TOKEN_SLOTS};
pub use kestrel_tokenizer::{ChatFunctionCall, ChatMessage, ChatToolCall};
pub use load::{not_a_chat_model, LoadOptions, LoadProgress, LoadedModel, ModelLoader};
pub use model::{BackendKind, Model, MAX_SLOTS};
pub use pacing::{submit_budget_from_ms, SubmitReport, MAX_SUBMIT_BUDGET};

/// Native convenience: loads a GGUF file from disk onto the GPU, streaming it in chunks.
#[cfg(not(target_arch = "wasm32"))]
pub async fn load_file(
    gpu: &kestrel_gpu::Gpu,
    path: &std::path::Path,
    options: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<Model, ModelError> {
    stream_file(ModelLoader::new(gpu, options), path, progress).await?.into_chat()
}

/// A chat or an embedding model from disk, for the GPU (an encoder's layers run there).
#[cfg(not(target_arch = "wasm32"))]
pub async fn load_file_any(
    gpu: &kestrel_gpu::Gpu,
    path: &std::path::Path,
    options: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadedModel, ModelError> {
    stream_file(ModelLoader::new(gpu, options), path, progress).await
}

/// The same for the CPU backend.
#[cfg(not(target_arch = "wasm32"))]
pub async fn load_file_cpu(
    path: &std::path::Path,
    options: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<Model, ModelError> {
    load_file_cpu_any(path, options, progress).await?.into_chat()
}

/// A chat or an embedding model from disk, on the CPU backend.
#[cfg(not(target_arch = "wasm32"))]
pub async fn load_file_cpu_any(
    path: &std::path::Path,
    options: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadedModel, ModelError> {
    stream_file(ModelLoader::new_cpu(options), path, progress).await
}

/// Streams the model at `path` into `loader`: its file, or where `path` names a split model's first
/// shard (`…-00001-of-0000N.gguf`), every shard in turn.
#[cfg(not(target_arch = "wasm32"))]
async fn stream_file(
    mut loader: ModelLoader,
    path: &std::path::Path,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadedModel, ModelError> {
    let paths = kestrel_gguf::model_files(path);
    for (i, shard) in paths.iter().enumerate() {
        if i > 0 {
            loader.next_shard()?;
        }
        push_file(&mut loader, shard, progress)?;
    }
    loader.finish_any().await
}

/// Pushes one file into `loader`: mapped where the system can map it, each tensor pushed whole
/// from the mapping (no read into a buffer and no copy into the reader's, whose fresh pages the
/// kernel zeroed: a third of an 8B file's load), else read in chunks (a pipe, a special file).
#[cfg(not(target_arch = "wasm32"))]
fn push_file(loader: &mut ModelLoader, path: &std::path::Path, progress: &mut dyn FnMut(&LoadProgress)) -> Result<(), ModelError> {
    use std::io::Read;
    const CHUNK: usize = 1 << 20;
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::BadModel(format!("{}: {e}", path.display())))?;
    // SAFETY: the mapping is only read, and dropped when the load ends. Like llama.cpp's own
    // mapping, it assumes the file is not truncated while it loads (that would fault the read).
    if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Sequential);
        let mut pos = 0;
        while pos < map.len() {
            // Up to the next tensor's end once the header is known; the header in chunks.
            let end = loader.next_tensor_end().and_then(|e| usize::try_from(e).ok()).filter(|&e| e > pos).unwrap_or(pos + CHUNK);
            let end = end.min(map.len());
            loader.push(&map[pos..end])?;
            // Give the pushed pages back: the mapping would otherwise hold the whole file in the
            // process's resident memory beside the converted weights.
            // SAFETY: nothing borrows the range any more (`push` converted or copied it), and the
            // mapping is shared and read-only over a file: a page dropped reads back from it.
            #[cfg(unix)]
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, pos, end - pos) };
            progress(&loader.progress());
            pos = end;
        }
        return Ok(());
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::BadModel(format!("{}: {e}", path.display())))?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else { break };
        loader.push(chunk)?;
        progress(&loader.progress());
    }
    Ok(())
}
