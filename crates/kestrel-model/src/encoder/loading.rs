//! Loading an encoder as its GGUF bytes stream in (`ModelLoader` hands an encoder's file here):
//! the header is checked first, then each tensor the encoder reads becomes a CPU backend matrix,
//! a GPU weight matrix (a layer's, when loaded for a GPU), or f32 values as soon as its bytes are
//! complete.

use std::collections::HashMap;

use kestrel_gguf::{GgufHeader, TensorInfo};
use kestrel_gpu::kernels::encoder::EncoderAttentionKernel;
use kestrel_gpu::{Gpu, WeightTensor};
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
    /// Where the layers run when loaded for a GPU (natively; the browser's embedding calls are
    /// synchronous, so they stay on the CPU backend there), and their matrices uploaded so far.
    gpu: Option<Gpu>,
    gpu_matrices: HashMap<String, WeightTensor>,
    pub(crate) tensors_loaded: usize,
}

/// Whether the tensor goes to the GPU: a layer's matrix (the embedding table and the rank head
/// stay with the host's ends of the pass).
fn on_gpu(name: &str, e: &EncoderTensor) -> bool {
    e.kind == Kind::Matrix && name.starts_with("blk.")
}

impl EncoderLoading {
    /// From the model's header, which must be its whole file (embedding models are small: a
    /// split one is refused). With `gpu`, the layers run there when the GPU reads every layer
    /// matrix's type and its attention kernel takes the heads (else all of it stays on the CPU
    /// backend).
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
        let gpu_reads_all = header
            .tensors
            .iter()
            .all(|t| expected.get(&t.name).is_none_or(|e| !on_gpu(&t.name, e) || kestrel_gpu::layout::is_gpu_supported(t.ggml_type)));
        let gpu_fits = config.head_dim <= EncoderAttentionKernel::MAX_HEAD_DIM;
        let gpu = gpu.filter(|_| gpu_reads_all && gpu_fits && cfg!(not(target_arch = "wasm32"))).cloned();
        Ok(Self {
            config,
            tokenizer: PendingTokenizer::new(vocabulary).start(),
            expected,
            tensors: EncoderTensors::default(),
            gpu,
            gpu_matrices: HashMap::new(),
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
            #[cfg(not(target_arch = "wasm32"))]
            Some(gpu) => {
                let encoder = super::GpuEncoder::new(&gpu, self.config, self.tensors, self.gpu_matrices).await?;
                Ok(Embedder::gpu_encoder(encoder, tokenizer))
            }
            _ => Ok(Embedder::new(Encoder::from_tensors(self.config, self.tensors)?, tokenizer)),
        }
    }
}
