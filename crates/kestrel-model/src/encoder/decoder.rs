//! Decoder embedding models (Qwen3-Embedding): a Llama-family file with `{arch}.pooling_type`
//! 1 to 3 embeds as llama.cpp's embedding contexts do, with the chat model (`Model`, on the GPU
//! or the CPU backend) run causally over each input from position 0, its final hidden state after
//! the output norm (llama.cpp's `result_norm`, before the LM head) pooled as the file says.

use std::sync::{Mutex, TryLockError};

use kestrel_gguf::GgufHeader;

use super::{EmbedderInfo, Pooling};
use crate::config::Arch;
use crate::error::ModelError;
use crate::model::Model;

/// The pooling of a Llama-family file that is an embedding model, or None for a chat model: no
/// `{arch}.pooling_type`, 0 (none: a vector per token, which llama.cpp gives only on request) or
/// 4 (rank: a reranker's score, not an embedding) stay chat models, as llama.cpp generates with
/// them too.
pub fn decoder_pooling(header: &GgufHeader) -> Result<Option<Pooling>, ModelError> {
    let md = &header.metadata;
    let Some(name) = md.get_str("general.architecture")? else { return Ok(None) };
    if Arch::from_name(name).is_none() {
        return Ok(None);
    }
    match md.get_u64(&format!("{name}.pooling_type"))? {
        Some(v @ 1..=3) => Pooling::from_gguf(v).map(Some),
        _ => Ok(None),
    }
}

/// A decoder that embeds, on either backend.
pub struct DecoderEmbedder {
    /// The pass appends to its KV cache: one input at a time holds it.
    model: Mutex<Model>,
    /// The model's device, where it runs on the GPU (read without the model's lock, which a
    /// call holds while it awaits the device).
    gpu: Option<kestrel_gpu::Gpu>,
    info: EmbedderInfo,
    weight_bytes: usize,
}

impl DecoderEmbedder {
    pub fn new(model: Model, pooling: Pooling) -> Self {
        let c = model.config();
        let info = EmbedderInfo {
            arch: c.arch.name(),
            name: c.name.clone(),
            n_layers: c.n_layers,
            hidden: c.hidden,
            n_heads: c.n_heads,
            vocab: c.vocab,
            train_context: c.train_context,
            pooling,
            context_length: model.context_length(),
        };
        let weight_bytes = usize::try_from(model.weight_bytes()).unwrap_or(usize::MAX);
        let gpu = model.gpu().cloned();
        Self { model: Mutex::new(model), gpu, info, weight_bytes }
    }

    pub fn info(&self) -> &EmbedderInfo {
        &self.info
    }

    /// Bytes of the weights (matrices and vectors, not the KV cache).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The GPU device it runs on, where it runs on one.
    pub fn gpu(&self) -> Option<&kestrel_gpu::Gpu> {
        self.gpu.as_ref()
    }

    /// The pooled (not normalized) vector of each input, every one run on its own from position
    /// 0 so that none attends to another. One call at a time: a second meanwhile (a page's
    /// overlapping calls; the package queues them) is `busy`.
    // The guard is held across the device's awaits on purpose: it is only ever taken with
    // `try_lock`, which never waits, so no call can block on another.
    #[allow(clippy::await_holding_lock)]
    pub async fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        // A call that panicked left nothing another needs: each input writes its KV rows from
        // position 0 before attending to them.
        let mut model = match self.model.try_lock() {
            Ok(model) => model,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(ModelError::Busy("another embedding call is running on this model")),
        };
        let mut vectors = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            let rows = model.normed_hidden(tokens).await?;
            vectors.push(pool(&rows, self.info.hidden, self.info.pooling));
        }
        Ok(vectors)
    }
}

/// One input's pooled vector from its rows (`[token][hidden]`): the mean of every row, the
/// first row (CLS) or the last.
fn pool(rows: &[f32], hidden: usize, pooling: Pooling) -> Vec<f32> {
    let n = rows.len() / hidden.max(1);
    let take = |i: usize| rows.get(i * hidden..(i + 1) * hidden).unwrap_or_default();
    match pooling {
        Pooling::Mean => {
            let mut sum = vec![0.0f64; hidden];
            for row in rows.chunks_exact(hidden) {
                sum.iter_mut().zip(row).for_each(|(s, &x)| *s += f64::from(x));
            }
            sum.into_iter().map(|s| (s / n.max(1) as f64) as f32).collect()
        }
        Pooling::Cls => take(0).to_vec(),
        // decoder_pooling never gives Rank (a decoder reranker stays a chat model); llama.cpp's
        // qwen3 reranker would pool the last token.
        Pooling::Last | Pooling::Rank => take(n.saturating_sub(1)).to_vec(),
    }
}
