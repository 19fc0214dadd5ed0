//! Loading an encoder as its GGUF bytes stream in (`ModelLoader` hands an encoder's file here):
//! the header is checked first, then each tensor the encoder reads becomes a CPU backend matrix
//! or f32 values as soon as its bytes are complete.

use std::collections::HashMap;

use kestrel_gguf::{GgufHeader, TensorInfo};
use kestrel_tokenizer::Vocabulary;

use super::{check_complete, check_shape, expected_tensors, Embedder, Encoder, EncoderConfig, EncoderTensor, EncoderTensors};
use crate::cpu_backend::Quantized;
use crate::error::{bad_model, ModelError};
use crate::pending_tokenizer::PendingTokenizer;

pub(crate) struct EncoderLoading {
    config: EncoderConfig,
    tokenizer: PendingTokenizer,
    expected: HashMap<String, EncoderTensor>,
    tensors: EncoderTensors<kestrel_cpu::Matrix>,
    pub(crate) tensors_loaded: usize,
}

impl EncoderLoading {
    /// From the model's header, which must be its whole file (embedding models are small: a
    /// split one is refused).
    pub(crate) fn new(config: EncoderConfig, header: &GgufHeader, shards: u32) -> Result<Self, ModelError> {
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
        Ok(Self {
            config,
            tokenizer: PendingTokenizer::new(vocabulary).start(),
            expected,
            tensors: EncoderTensors::default(),
            tensors_loaded: 0,
        })
    }

    pub(crate) fn tensors_total(&self) -> usize {
        self.expected.len()
    }

    pub(crate) fn add_tensor(&mut self, info: &TensorInfo, bytes: &[u8]) -> Result<(), ModelError> {
        let Some(e) = self.expected.get(&info.name) else { return Ok(()) };
        self.tensors.add::<Quantized>(&info.name, e, info.ggml_type, bytes)?;
        self.tensors_loaded += 1;
        Ok(())
    }

    pub(crate) fn into_embedder(self) -> Result<Embedder, ModelError> {
        let tokenizer = self.tokenizer.finish()?;
        if tokenizer.vocab_size() != self.config.vocab {
            return Err(bad_model(format!("tokenizer has {} tokens, the model {}", tokenizer.vocab_size(), self.config.vocab)));
        }
        Ok(Embedder::new(Encoder::from_tensors(self.config, self.tensors)?, tokenizer))
    }
}
