//! Decoder embedding models (Qwen3-Embedding): a Llama-family file with `{arch}.pooling_type`
//! 1 to 3 embeds as llama.cpp's embedding contexts do, with the chat graph (`CpuForward`) run
//! causally over each input from position 0, its final hidden state after the output norm
//! (llama.cpp's `result_norm`, before the LM head) pooled as the file says.

use std::sync::{Mutex, MutexGuard, PoisonError};

use kestrel_gguf::GgufHeader;

use super::{EmbedderInfo, Pooling};
use crate::config::Arch;
use crate::cpu_backend::Quantized;
use crate::cpu_forward::{CpuForward, SequenceStep};
use crate::error::ModelError;

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

/// A decoder on the CPU backend that embeds.
pub struct DecoderEmbedder {
    /// The pass appends to its KV cache: one input at a time holds it.
    forward: Mutex<CpuForward<Quantized>>,
    info: EmbedderInfo,
    /// Most tokens one pass runs: a long input runs in chunks, as a prompt's prefill does, so
    /// that the activations stay those of a chunk.
    chunk: usize,
    weight_bytes: usize,
}

impl DecoderEmbedder {
    pub fn new(forward: CpuForward<Quantized>, pooling: Pooling, chunk: usize) -> Self {
        let c = &forward.config;
        let info = EmbedderInfo {
            arch: c.arch.name(),
            name: c.name.clone(),
            n_layers: c.n_layers,
            hidden: c.hidden,
            n_heads: c.n_heads,
            vocab: c.vocab,
            train_context: c.train_context,
            pooling,
            context_length: forward.max_ctx(),
        };
        let weight_bytes = forward.buffer_bytes() - forward.cache_bytes();
        Self { forward: Mutex::new(forward), info, chunk: chunk.max(1), weight_bytes }
    }

    pub fn info(&self) -> &EmbedderInfo {
        &self.info
    }

    /// Bytes of the weights (matrices and vectors, not the KV cache).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The pooled (not normalized) vector of each input, every one run on its own from position
    /// 0 so that none attends to another.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut forward = self.lock();
        let (hidden, pooling) = (self.info.hidden, self.info.pooling);
        inputs
            .iter()
            .map(|tokens| {
                let mut pooled = vec![0.0f64; hidden];
                let mut pos = 0;
                for chunk in tokens.chunks(self.chunk) {
                    let rows = forward.normed_hidden(&[SequenceStep { slot: 0, pos, tokens: chunk, logits: false }])?;
                    let first = pos;
                    pos += chunk.len();
                    for (i, row) in rows.chunks_exact(hidden).enumerate() {
                        let take = match pooling {
                            Pooling::Mean => true,
                            Pooling::Cls => first + i == 0,
                            // decoder_pooling never gives Rank (a decoder reranker stays a chat
                            // model); llama.cpp's qwen3 reranker would pool the last token.
                            Pooling::Last | Pooling::Rank => first + i + 1 == tokens.len(),
                        };
                        if take {
                            pooled.iter_mut().zip(row).for_each(|(p, &x)| *p += f64::from(x));
                        }
                    }
                }
                let scale = if pooling == Pooling::Mean { 1.0 / tokens.len().max(1) as f64 } else { 1.0 };
                Ok(pooled.into_iter().map(|p| (p * scale) as f32).collect())
            })
            .collect()
    }

    /// The pass. A call that panicked left nothing another needs: each input writes its KV rows
    /// from position 0 before attending to them.
    fn lock(&self) -> MutexGuard<'_, CpuForward<Quantized>> {
        self.forward.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
