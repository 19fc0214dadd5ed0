//! Models with the real shapes and weight types of common model sizes and random weights, made
//! in memory as a GGUF stream and loaded like a downloaded file, for benchmarks on machines where
//! no model file can travel (`kestrel bench model --synthetic 1b`, bench/gpu-check.sh).
//!
//! The weights are drawn from a pool of genuinely quantized random blocks (each tensor's blocks
//! picked from the pool by a seeded generator), so every scale is a valid value and the kernels
//! do exactly the work a real file makes them do. The vocabulary is a placeholder SentencePiece
//! one (`<unk>`, `<s>`, `</s>`, the 256 byte tokens, then filler pieces) of the model's size.

use kestrel_gguf::{GgmlType, GgufWriter, Metadata, MetadataValue, TensorSpec};

use crate::error::{bad_model, ModelError};

/// A model size: the layout of a well-known model of that size (Llama-family graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticShape {
    pub name: &'static str,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab: usize,
    /// Type of the layers' matrices.
    pub matrix_type: GgmlType,
    /// Type of the token embedding (also the LM head: the shapes here tie them).
    pub embedding_type: GgmlType,
}

/// SmolLM2-135M, the default model (its 576-wide rows allow no K-quants: Q4_1 as its file).
pub const SMOLLM2_135M: SyntheticShape = SyntheticShape {
    name: "135m",
    n_layers: 30,
    hidden: 576,
    ffn: 1536,
    n_heads: 9,
    n_kv_heads: 3,
    vocab: 49152,
    matrix_type: GgmlType::Q4_1,
    embedding_type: GgmlType::Q4_1,
};

/// Llama 3.2 1B (Q4_K matrices, Q6_K embedding, as in its Q4_K_M file).
pub const LLAMA_1B: SyntheticShape = SyntheticShape {
    name: "1b",
    n_layers: 16,
    hidden: 2048,
    ffn: 8192,
    n_heads: 32,
    n_kv_heads: 8,
    vocab: 128256,
    matrix_type: GgmlType::Q4_K,
    embedding_type: GgmlType::Q6_K,
};

/// Llama 3.1 8B (Q4_K matrices, Q6_K embedding, as in its Q4_K_M file).
pub const LLAMA_8B: SyntheticShape = SyntheticShape {
    name: "8b",
    n_layers: 32,
    hidden: 4096,
    ffn: 14336,
    n_heads: 32,
    n_kv_heads: 8,
    vocab: 128256,
    matrix_type: GgmlType::Q4_K,
    embedding_type: GgmlType::Q6_K,
};

/// Every shape, by size: the ones `synthetic_shape` finds by name.
pub const SYNTHETIC_SHAPES: [SyntheticShape; 3] = [SMOLLM2_135M, LLAMA_1B, LLAMA_8B];

/// The shape called `name` (case-insensitive).
pub fn synthetic_shape(name: &str) -> Option<SyntheticShape> {
    SYNTHETIC_SHAPES.iter().copied().find(|s| s.name.eq_ignore_ascii_case(name))
}

/// Blocks in the pool each tensor's blocks are drawn from.
const POOL_BLOCKS: usize = 4096;
/// Bytes handed to the sink at a time.
const CHUNK_BYTES: usize = 4 << 20;

/// A small seeded generator (SplitMix64): the same model for the same seed on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `POOL_BLOCKS` blocks of `ty` quantized from uniform values of scale `scale`.
fn block_pool(ty: GgmlType, scale: f32, rng: &mut SplitMix) -> Result<Vec<u8>, ModelError> {
    let values: Vec<f32> = (0..POOL_BLOCKS * ty.block_size() as usize).map(|_| scale * rng.unit()).collect();
    Ok(kestrel_gguf::quantize(ty, &values)?)
}

impl SyntheticShape {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.n_heads
    }

    /// Width of the attention output (all query heads).
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim()
    }

    /// Width of the K (and of the V) projection's output.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim()
    }

    /// Width of the fused Q|K|V projection's output.
    pub fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }

    fn metadata(&self) -> Metadata {
        let mut md = Metadata::new();
        let u32v = |v: usize| MetadataValue::U32(v as u32);
        md.set("general.architecture", MetadataValue::String("llama".into()));
        md.set("general.name", MetadataValue::String(format!("synthetic {}", self.name)));
        md.set("llama.context_length", u32v(8192));
        md.set("llama.embedding_length", u32v(self.hidden));
        md.set("llama.feed_forward_length", u32v(self.ffn));
        md.set("llama.block_count", u32v(self.n_layers));
        md.set("llama.attention.head_count", u32v(self.n_heads));
        md.set("llama.attention.head_count_kv", u32v(self.n_kv_heads));
        md.set("llama.rope.freq_base", MetadataValue::F32(500_000.0));
        md.set("llama.attention.layer_norm_rms_epsilon", MetadataValue::F32(1e-5));
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].iter().map(|t| t.to_string()).collect();
        tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        let fillers = self.vocab.saturating_sub(tokens.len());
        tokens.extend((0..fillers).map(|i| format!("\u{2581}w{i}")));
        let n = tokens.len();
        let types = (0..n)
            .map(|i| {
                MetadataValue::I32(if i < 3 {
                    3
                } else if i < 259 {
                    6
                } else {
                    1
                })
            })
            .collect();
        md.set("tokenizer.ggml.model", MetadataValue::String("llama".into()));
        md.set("tokenizer.ggml.tokens", MetadataValue::Array(tokens.into_iter().map(MetadataValue::String).collect()));
        md.set("tokenizer.ggml.scores", MetadataValue::Array((0..n).map(|i| MetadataValue::F32(-(i as f32))).collect()));
        md.set("tokenizer.ggml.token_type", MetadataValue::Array(types));
        md.set("tokenizer.ggml.unknown_token_id", MetadataValue::U32(0));
        md.set("tokenizer.ggml.bos_token_id", MetadataValue::U32(1));
        md.set("tokenizer.ggml.eos_token_id", MetadataValue::U32(2));
        md
    }

    /// The tensors in file order: name, (rows, cols), type.
    fn tensors(&self) -> Vec<(String, usize, usize, GgmlType)> {
        let (h, f, q, kv) = (self.hidden, self.ffn, self.q_width(), self.kv_width());
        let mut out = vec![("token_embd.weight".to_string(), self.vocab, h, self.embedding_type)];
        for l in 0..self.n_layers {
            let name = |s: &str| format!("blk.{l}.{s}");
            let m = self.matrix_type;
            out.extend([
                (name("attn_norm.weight"), 1, h, GgmlType::F32),
                (name("attn_q.weight"), q, h, m),
                (name("attn_k.weight"), kv, h, m),
                (name("attn_v.weight"), kv, h, m),
                (name("attn_output.weight"), h, q, m),
                (name("ffn_norm.weight"), 1, h, GgmlType::F32),
                (name("ffn_gate.weight"), f, h, m),
                (name("ffn_up.weight"), f, h, m),
                (name("ffn_down.weight"), h, f, m),
            ]);
        }
        out.push(("output_norm.weight".to_string(), 1, h, GgmlType::F32));
        out
    }

    fn specs(&self) -> Vec<TensorSpec> {
        self.tensors()
            .into_iter()
            .map(|(name, rows, cols, ty)| TensorSpec {
                name,
                dims: if rows == 1 { vec![cols as u64] } else { vec![cols as u64, rows as u64] },
                ggml_type: ty,
            })
            .collect()
    }

    /// Generates the GGUF stream, handing it to `sink` in chunks of a few MiB.
    pub fn generate(&self, seed: u64, sink: &mut dyn FnMut(&[u8]) -> Result<(), ModelError>) -> Result<(), ModelError> {
        if !self.hidden.is_multiple_of(self.n_heads) || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(bad_model(format!("synthetic shape {}: heads do not divide", self.name)));
        }
        let mut rng = SplitMix(seed);
        let out = ChunkedSink { buffer: Vec::with_capacity(2 * CHUNK_BYTES), sink, error: None };
        let mut writer = GgufWriter::new(out, &self.metadata(), &self.specs())?;
        let mut pools: Vec<(GgmlType, Vec<u8>)> = Vec::new();
        for (name, rows, cols, ty) in self.tensors() {
            let bytes: Vec<u8> = if ty == GgmlType::F32 {
                // Norm weights: ones, so activations keep their scale through the layers.
                std::iter::repeat_n(1f32.to_le_bytes(), rows * cols).flatten().collect()
            } else {
                if !pools.iter().any(|(t, _)| *t == ty) {
                    // Weights of standard deviation about 1 / sqrt(cols): outputs keep the
                    // inputs' scale.
                    let pool = block_pool(ty, 1.7 / (cols as f32).sqrt(), &mut rng)?;
                    pools.push((ty, pool));
                }
                let pool = pools.iter().find(|(t, _)| *t == ty).map(|(_, p)| p).ok_or_else(|| bad_model("no block pool"))?;
                let block = ty.type_size() as usize;
                let n_blocks = rows * cols / ty.block_size() as usize;
                let mut bytes = Vec::with_capacity(n_blocks * block);
                for _ in 0..n_blocks {
                    let b = (rng.next() % POOL_BLOCKS as u64) as usize;
                    bytes.extend_from_slice(&pool[b * block..(b + 1) * block]);
                }
                bytes
            };
            if let Err(e) = writer.write_tensor(&bytes) {
                return Err(writer_error(e, &name));
            }
        }
        let mut out = writer.finish().map_err(|e| writer_error(e, "the end of the file"))?;
        if let Some(e) = out.error.take() {
            return Err(e);
        }
        (out.sink)(&out.buffer)
    }
}

fn writer_error(e: kestrel_gguf::GgufError, what: &str) -> ModelError {
    bad_model(format!("synthetic model, {what}: {e}"))
}

/// A `Write` that hands its bytes to a sink in chunks of `CHUNK_BYTES`, keeping the sink's error.
struct ChunkedSink<'a> {
    buffer: Vec<u8>,
    sink: &'a mut dyn FnMut(&[u8]) -> Result<(), ModelError>,
    error: Option<ModelError>,
}

impl std::io::Write for ChunkedSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        match (self.sink)(&self.buffer) {
            Ok(()) => {
                self.buffer.clear();
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                self.error = Some(e);
                Err(std::io::Error::other(message))
            }
        }
    }
}

/// Generates `shape` with `seed` and streams it into `loader` (GPU or CPU), as a file would.
pub async fn load_synthetic(mut loader: crate::ModelLoader, shape: &SyntheticShape, seed: u64) -> Result<crate::Model, ModelError> {
    shape.generate(seed, &mut |chunk| loader.push(chunk))?;
    loader.finish().await
}
