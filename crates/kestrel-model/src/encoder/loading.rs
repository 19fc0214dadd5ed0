//! Loading an encoder as its GGUF bytes stream in (`ModelLoader` hands an encoder's file here):
//! the header is checked first, then each tensor the encoder reads becomes a CPU backend matrix,
//! a GPU weight matrix (a layer's, when loaded for a GPU), or f32 values as soon as its bytes are
//! complete.

use std::collections::HashMap;

use kestrel_gguf::{GgufHeader, TensorInfo};
use kestrel_gpu::kernels::encoder::EncoderAttentionKernel;
use kestrel_gpu::{Gpu, UploadFlusher, WeightTensor};
use kestrel_tokenizer::Vocabulary;

use super::{check_complete, check_shape, expected_tensors, Embedder, Encoder, EncoderConfig, EncoderTensor, EncoderTensors, Kind};
use crate::cpu_backend::Quantized;
use crate::error::{bad_model, ModelError};
use crate::pending_tokenizer::PendingTokenizer;

pub(crate) struct EncoderLoading {
    config: EncoderConfig,
    tokenizer: PendingTokenizer,
    expected: HashMap<String, EncoderTensor>,
    tensors: EncoderTensors<kestrel_cpu::Matrix>,
    /// Where the layers run when loaded for a GPU, and their matrices uploaded so far.
    gpu: Option<Gpu>,
    gpu_matrices: HashMap<String, WeightTensor>,
    /// The uploads' staging copies, given back as the load goes.
    flusher: UploadFlusher,
    /// Loaded for a GPU that does not run its layers: why (`gpu_declines`).
    declined: Option<String>,
    pub(crate) tensors_loaded: usize,
}

/// Whether the tensor goes to the GPU: a layer's matrix (the embedding table and the rank head
/// stay with the host's ends of the pass).
pub(crate) fn on_gpu(name: &str, e: &EncoderTensor) -> bool {
    e.kind == Kind::Matrix && name.starts_with("blk.")
}

/// Why an engine with a GPU runs the encoder of `config` (`expected`: its tensors in `header`)
/// on the CPU backend: a layer matrix of a type the GPU kernels do not read, or heads wider than
/// the GPU attention kernel takes. None: its layers run on the GPU.
pub(crate) fn gpu_declines(config: &EncoderConfig, header: &GgufHeader, expected: &HashMap<String, EncoderTensor>) -> Option<String> {
    let unread = header
        .tensors
        .iter()
        .find(|t| expected.get(&t.name).is_some_and(|e| on_gpu(&t.name, e) && !kestrel_gpu::layout::is_gpu_supported(t.ggml_type)));
    if let Some(t) = unread {
        return Some(format!("the GPU kernels do not read {}'s type {}", t.name, t.ggml_type));
    }
    (config.head_dim > EncoderAttentionKernel::MAX_HEAD_DIM)
        .then(|| format!("heads of {} values are wider than the GPU attention's {}", config.head_dim, EncoderAttentionKernel::MAX_HEAD_DIM))
}

impl EncoderLoading {
    /// From the model's header, which must be its whole file (embedding models are small: a
    /// split one is refused). With `gpu`, the layers run there unless `gpu_declines` (then all of
    /// it stays on the CPU backend).
    pub(crate) fn new(config: EncoderConfig, header: &GgufHeader, shards: u32, gpu: Option<&Gpu>) -> Result<Self, ModelError> {
        if shards != 1 {
            return Err(bad_model(format!(
                "{} embedding model split in {shards} files: join it (llama.cpp's gguf-split --merge)",
                config.arch.name()
            )));
        }
        let vocabulary = Vocabulary::from_metadata(&header.metadata)?;
        let expected = expected_tensors(&config, header);
        for info in &header.tensors {
            check_shape(&expected, info)?;
        }
        check_complete(&expected, header.tensors.iter().map(|t| t.name.as_str()))?;
        let declined = gpu.and_then(|_| gpu_declines(&config, header, &expected));
        let gpu = gpu.filter(|_| declined.is_none()).cloned();
        Ok(Self {
            declined,
            config,
            tokenizer: PendingTokenizer::new(vocabulary).start(),
            expected,
            tensors: EncoderTensors::default(),
            gpu,
            gpu_matrices: HashMap::new(),
            flusher: UploadFlusher::default(),
            tensors_loaded: 0,
        })
    }

    pub(crate) fn tensors_total(&self) -> usize {
        self.expected.len()
    }

    pub(crate) fn add_tensor(&mut self, info: &TensorInfo, bytes: &[u8]) -> Result<(), ModelError> {
        let Some(e) = self.expected.get(&info.name) else { return Ok(()) };
        match &self.gpu {
            Some(gpu) if on_gpu(&info.name, e) => {
                let w = WeightTensor::from_gguf_bytes(gpu, &info.name, info.ggml_type, e.rows, e.cols, bytes)?;
                self.gpu_matrices.insert(info.name.clone(), w);
                self.flusher.uploaded(gpu, bytes.len());
            }
            _ => self.tensors.add::<Quantized>(&info.name, e, info.ggml_type, bytes)?,
        }
        self.tensors_loaded += 1;
        Ok(())
    }

    pub(crate) async fn into_embedder(self) -> Result<Embedder, ModelError> {
        let tokenizer = self.tokenizer.finish()?;
        if tokenizer.vocab_size() != self.config.vocab {
            return Err(bad_model(format!("tokenizer has {} tokens, the model {}", tokenizer.vocab_size(), self.config.vocab)));
        }
        match self.gpu {
            Some(gpu) => {
                let encoder = super::GpuEncoder::new(&gpu, self.config, self.tensors, self.gpu_matrices).await?;
                Ok(Embedder::gpu_encoder(encoder, tokenizer))
            }
            None => {
                let embedder = Embedder::new(Encoder::from_tensors(self.config, self.tensors)?, tokenizer);
                Ok(match self.declined {
                    Some(why) => embedder.declined_gpu(why),
                    None => embedder,
                })
            }
        }
    }
}
