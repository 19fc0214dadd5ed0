//! Small random-weight models of the architectures Kestrel runs, written with Kestrel's own GGUF
//! writer: the real architecture's metadata keys and tensor names, small shapes in the real
//! proportions, seeded random weights in the given types, and the default model's tokenizer
//! (its vocabulary, merges and chat template). llama.cpp runs such a file as it runs a trained
//! one, so its logits and greedy tokens (tests/data/<reference_dir>/greedy.json, made by
//! tools/llama-cpp/reference.mjs from the file this writes) are the architecture's reference.
//!
//! The file is deterministic (seeded RNG, the pinned quantizers); `write` checks its sha256
//! against the one the reference was made from, so a change here cannot silently compare
//! against a reference of another file.

use std::path::PathBuf;

use kestrel_gguf::{GgmlType, GgufWriter, Metadata, MetadataValue, TensorSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

/// One test model: its architecture and shapes, and where llama.cpp's reference for it lives.
#[derive(Clone, Debug)]
pub struct SyntheticModel {
    pub label: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    /// Directory of llama.cpp's greedy reference under tests/data.
    pub reference_dir: &'static str,
    /// sha256 of the file llama.cpp's reference was made from.
    pub sha256: &'static str,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Type of every matrix, the embedding and the output included.
    pub matrix_type: GgmlType,
    /// A separate `output.weight` (else the LM head is the embedding).
    pub untied_output: bool,
    /// Q, K and V biases (`attn_{q,k,v}.bias`), as Qwen2 has.
    pub qkv_bias: bool,
    /// Qwen3's per-head Q and K norms (`attn_{q,k}_norm.weight`).
    pub qk_norm: bool,
    /// Phi-3's layout: one `attn_qkv` tensor and one `ffn_up` tensor holding gate and up.
    pub fused_tensors: bool,
    pub rope: SyntheticRope,
    /// Gemma's post-attention and post-FFN norms, and its other metadata.
    pub gemma: Option<SyntheticGemma>,
    /// The largest allowed |Kestrel - llama.cpp| of the first step's top-5 log-probabilities.
    pub logprob_tolerance: f64,
    /// Greedy steps are compared up to llama.cpp's first top-two margin below this.
    pub near_tie: f64,
    pub seed: u64,
}

/// Gemma's metadata: soft caps, sliding window, the sliding layers' RoPE base.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticGemma {
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    pub sliding_window: u32,
    pub rope_base_swa: f32,
}

/// How a test model scales RoPE.
#[derive(Clone, Copy, Debug)]
pub enum SyntheticRope {
    Plain,
    /// `rope.scaling.type` yarn with this factor from `original_context` positions.
    Yarn {
        factor: f32,
        original_context: u32,
    },
    /// Phi-3.5's long and short factor tables (`rope_factors_{long,short}.weight`, long ones
    /// beyond `original_context`) and attention factor.
    LongShort {
        attn_factor: f32,
        original_context: u32,
    },
}

/// What the test models share unless they say otherwise: 4 layers of hidden size 256, F32
/// matrices (see `QWEN2_F32` for what F32 leaves between the engines), tied embeddings, eps 1e-6,
/// no biases, extra norms or fused tensors, plain RoPE, and the F32 agreement bounds.
const BASE: SyntheticModel = SyntheticModel {
    label: "",
    arch: "",
    reference_dir: "",
    sha256: "",
    n_layers: 4,
    hidden: 256,
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 64,
    ffn: 768,
    rope_base: 10_000.0,
    rms_eps: 1e-6,
    matrix_type: GgmlType::F32,
    untied_output: false,
    qkv_bias: false,
    qk_norm: false,
    fused_tensors: false,
    rope: SyntheticRope::Plain,
    gemma: None,
    logprob_tolerance: 0.01,
    near_tie: 0.01,
    seed: 0,
};

/// Qwen2.5-0.5B's proportions, scaled down: head_dim 32 (not the default model's 64), 8 query
/// heads sharing 2 KV heads, Q/K/V biases, a separate output matrix, RoPE base 1e6, eps 1e-6.
/// F32 matrices: llama.cpp multiplies them in f32 (no 8-bit activations), so only its f16 KV
/// cache and summation order separate it from Kestrel: measured, the first step's top-5
/// log-probabilities agree within 0.002 and all 32 greedy steps of every prompt match, through
/// margins down to 0.003.
pub const QWEN2_F32: SyntheticModel = SyntheticModel {
    label: "qwen2 F32",
    arch: "qwen2",
    reference_dir: "reference-qwen2-f32",
    sha256: "d2c0b1a2caf9419515bb760ab9eb6ce2611e7754edc677910295419b19020bce",
    n_heads: 8,
    n_kv_heads: 2,
    head_dim: 32,
    ffn: 704,
    rope_base: 1_000_000.0,
    untied_output: true,
    qkv_bias: true,
    seed: 0x51_5745_4E32,
    ..BASE
};

/// The same weights in Q8_0, the type of the products' fast path: llama.cpp quantizes the
/// activations to 8 bits for them, which moves its first-step log-probabilities by up to 0.13
/// from Kestrel's exact f32 (0.128 measured; the `llama` architecture with the same weights
/// moves as much), and flipped a step of margin 0.117: the bound is 0.2 and steps with a margin
/// under 0.25 may flip.
pub const QWEN2_Q8_0: SyntheticModel = SyntheticModel {
    label: "qwen2 Q8_0",
    reference_dir: "reference-qwen2-q8_0",
    sha256: "95797b7af48e29b9c6696594876d9ebbbe99083e8744641278e5fa52f36ffc62",
    matrix_type: GgmlType::Q8_0,
    logprob_tolerance: 0.2,
    near_tie: 0.25,
    ..QWEN2_F32
};

/// Qwen3-0.6B's proportions, scaled down: 4 query heads of 128 dimensions (Q is twice as wide
/// as the hidden size of 256, as 16 x 128 over 1024 is in the real model) sharing 2 KV heads,
/// per-head RMSNorm of Q and K, no biases, tied embeddings, RoPE base 1e6 (NeoX), eps 1e-6.
pub const QWEN3_F32: SyntheticModel = SyntheticModel {
    label: "qwen3 F32",
    arch: "qwen3",
    reference_dir: "reference-qwen3-f32",
    sha256: "b88dcca07154f817702f9f3ea147f7ac6e458f44e821e66e928cbeadc975d7d6",
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 128,
    ffn: 768,
    rope_base: 1_000_000.0,
    qk_norm: true,
    seed: 0x51_5745_4E33,
    ..BASE
};

/// The Qwen3 layout with YaRN scaling by 4 from 512 positions and RoPE base 1e4: YaRN's ramp then
/// runs from pair 6 to pair 31 of 64 (`YarnRamp`), so the prompts' positions reach angles where
/// extrapolated, mixed and interpolated pairs all differ, and its magnitude factor
/// (1 + 0.1 ln 4) scales every attention score by 1.3.
pub const QWEN3_YARN_F32: SyntheticModel = SyntheticModel {
    label: "qwen3 YaRN F32",
    reference_dir: "reference-qwen3-yarn-f32",
    sha256: "f0a58a663b98ef90ebde63cdc755f14ae025fb60b7e53f8b4a6c9a924fbf24f6",
    rope_base: 10_000.0,
    rope: SyntheticRope::Yarn { factor: 4.0, original_context: 512 },
    seed: 0x5941_524E,
    ..QWEN3_F32
};

/// SmolLM3-3B's proportions, scaled down: 4 layers of which the fourth has no RoPE (llama.cpp's
/// fixed `n_no_rope_layer_step` of 4), 4 query heads of 64 sharing 1 KV head, hidden 256, tied
/// embeddings, RoPE base 5e6 (normal mode), eps 1e-6.
pub const SMOLLM3_F32: SyntheticModel = SyntheticModel {
    label: "smollm3 F32",
    arch: "smollm3",
    reference_dir: "reference-smollm3-f32",
    sha256: "4032a60403e95d067e7d0adde4ce96df1168ab8aad5aca69fbf09443a8020367",
    n_heads: 4,
    n_kv_heads: 1,
    head_dim: 64,
    ffn: 1376,
    rope_base: 5_000_000.0,
    seed: 0x53_4D4F_4C33,
    ..BASE
};

/// Phi-3.5-mini's layout, scaled down: fused `attn_qkv` and gate|up `ffn_up` tensors, 4 heads of
/// 96 (the real head size) without GQA, hidden 384, a separate output matrix, RoPE base 1e4
/// (NeoX), eps 1e-5, and its
/// LongRoPE tables with attention factor 1.19 from 4096 original positions: at the tests'
/// contexts (llama.cpp 2048, Kestrel 1024) both use the short factors. The label (written as
/// `general.name`) avoids "phi3" and "phi-3": llama.cpp gives a model so named Phi-3's special
/// token attributes, which needs Phi-3's vocabulary (it fails on "</s>" missing from this one).
pub const PHI3_F32: SyntheticModel = SyntheticModel {
    label: "Phi 3 F32",
    arch: "phi3",
    reference_dir: "reference-phi3-f32",
    sha256: "863dd2b8ead60394c7b9a6b5d4e0763021a8a0d7f0231f2eda15f4f139e3d403",
    hidden: 384,
    n_heads: 4,
    n_kv_heads: 4,
    head_dim: 96,
    ffn: 1024,
    rope_base: 10_000.0,
    rms_eps: 1e-5,
    untied_output: true,
    fused_tensors: true,
    rope: SyntheticRope::LongShort { attn_factor: 1.19, original_context: 4096 },
    seed: 0x5048_4933,
    ..BASE
};

/// The same Phi-3 layout from 512 original positions: both engines' contexts exceed it, so both
/// use the long factors.
pub const PHI3_LONG_F32: SyntheticModel = SyntheticModel {
    label: "Phi 3 long-factor F32",
    reference_dir: "reference-phi3-long-f32",
    sha256: "03bf4b42dcb583896f85c6af17ad8d3c968a0a2e9e8181d176d9a0e12b01a5b2",
    rope: SyntheticRope::LongShort { attn_factor: 1.19, original_context: 512 },
    ..PHI3_F32
};

/// Gemma-2-2B's layout, scaled down: 4 query heads of 128 (Q wider than the hidden size of 256,
/// as 8 x 256 is over 2304) sharing 2 KV heads, GeGLU FFN 1024, embeddings scaled by
/// sqrt(hidden) and tied, post-attention and post-FFN norms, sliding windows of 16 in layers 0
/// and 2 (llama.cpp's pattern 2), RoPE base 1e4 (NeoX), eps 1e-6, and logits soft-capped at 30
/// as in the real model. The score cap is 3 instead of the real 50: these random scores are of
/// order 1 and never come near 50 (at 10 the cap moved llama.cpp's log-probabilities by only
/// 0.06); at 3 it bends them measurably.
pub const GEMMA2_F32: SyntheticModel = SyntheticModel {
    label: "gemma2 F32",
    arch: "gemma2",
    reference_dir: "reference-gemma2-f32",
    sha256: "8054c29be69b323c9babefa529618102c398901ceb855ec7771518b9e205edc3",
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 128,
    ffn: 1024,
    rope_base: 10_000.0,
    gemma: Some(SyntheticGemma { attn_softcap: Some(3.0), final_softcap: Some(30.0), sliding_window: 16, rope_base_swa: 10_000.0 }),
    seed: 0x4745_4D32,
    ..BASE
};

/// Gemma-3-270M's layout, scaled down: 6 layers (five with a sliding window of 16, then one
/// global: llama.cpp's pattern 6), 2 query heads of 256 (the real head size) sharing 1 KV head,
/// per-head Q/K norms, GeGLU FFN 768, embeddings scaled by sqrt(hidden) and tied, post norms,
/// RoPE base 1e6 for the global layer and 1e4 for the sliding ones, no soft caps, eps 1e-6.
pub const GEMMA3_F32: SyntheticModel = SyntheticModel {
    label: "gemma3 F32",
    arch: "gemma3",
    reference_dir: "reference-gemma3-f32",
    sha256: "243c68795a41052712a8f70556825417a491db710087b9d557eb2f557cb744f1",
    n_layers: 6,
    n_heads: 2,
    n_kv_heads: 1,
    head_dim: 256,
    ffn: 768,
    rope_base: 1_000_000.0,
    qk_norm: true,
    gemma: Some(SyntheticGemma { attn_softcap: None, final_softcap: None, sliding_window: 16, rope_base_swa: 10_000.0 }),
    seed: 0x4745_4D33,
    ..BASE
};

/// The Gemma 3 weights in Q4_K, every matrix and the embedding: the K-quant path of an
/// architecture other than the default model's. llama.cpp quantizes the activations of K-quant
/// products to 8 bits per 256 values (Q8_K), which moves its first-step log-probabilities up to
/// 0.21 from Kestrel's exact f32 (measured over the 7 prompts; the default model's Q4_K_M moves
/// up to 0.36): the bound is 0.3, and steps with a llama.cpp margin under 0.3 may flip.
pub const GEMMA3_Q4_K: SyntheticModel = SyntheticModel {
    label: "gemma3 Q4_K",
    reference_dir: "reference-gemma3-q4_k",
    sha256: "b9a1a7999a020d94cd546bad93aa5a603158f7b7307da2e0ce38ab4fa4182f85",
    matrix_type: GgmlType::Q4_K,
    logprob_tolerance: 0.3,
    near_tie: 0.3,
    ..GEMMA3_F32
};

/// Every synthetic model the tests run.
pub const SYNTHETIC_MODELS: [SyntheticModel; 10] =
    [QWEN2_F32, QWEN2_Q8_0, QWEN3_F32, QWEN3_YARN_F32, SMOLLM3_F32, PHI3_F32, PHI3_LONG_F32, GEMMA2_F32, GEMMA3_F32, GEMMA3_Q4_K];

/// Uniform values with standard deviation `std` (uniform on [-a, a] has std a / sqrt(3)).
fn uniform(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    let a = std * 3f32.sqrt();
    (0..n).map(|_| rng.random_range(-a..a)).collect()
}

/// The keys of the default model that describe its tokenizer (vocabulary, merges, special
/// tokens, chat template): every `tokenizer.*` key.
fn tokenizer_metadata() -> Metadata {
    let (header, _) = super::default_model_file();
    let mut out = Metadata::new();
    for (key, value) in header.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        out.set(key, value.clone());
    }
    out
}

impl SyntheticModel {
    fn vocab(tokenizer: &Metadata) -> usize {
        tokenizer.get_string_array("tokenizer.ggml.tokens").expect("tokens").expect("the default model has tokens").len()
    }

    fn metadata(&self, tokenizer: &Metadata) -> Metadata {
        let mut md = Metadata::new();
        let arch = self.arch;
        md.set("general.architecture", MetadataValue::String(arch.into()));
        md.set("general.name", MetadataValue::String(format!("kestrel synthetic {}", self.label)));
        let u32v = |v: usize| MetadataValue::U32(v as u32);
        md.set(format!("{arch}.context_length"), u32v(4096));
        md.set(format!("{arch}.embedding_length"), u32v(self.hidden));
        md.set(format!("{arch}.feed_forward_length"), u32v(self.ffn));
        md.set(format!("{arch}.block_count"), u32v(self.n_layers));
        md.set(format!("{arch}.attention.head_count"), u32v(self.n_heads));
        md.set(format!("{arch}.attention.head_count_kv"), u32v(self.n_kv_heads));
        md.set(format!("{arch}.attention.key_length"), u32v(self.head_dim));
        md.set(format!("{arch}.attention.value_length"), u32v(self.head_dim));
        md.set(format!("{arch}.rope.freq_base"), MetadataValue::F32(self.rope_base));
        md.set(format!("{arch}.attention.layer_norm_rms_epsilon"), MetadataValue::F32(self.rms_eps));
        if let Some(g) = self.gemma {
            md.set(format!("{arch}.attention.sliding_window"), u32v(g.sliding_window as usize));
            md.set(format!("{arch}.rope.freq_base_swa"), MetadataValue::F32(g.rope_base_swa));
            if let Some(cap) = g.attn_softcap {
                md.set(format!("{arch}.attn_logit_softcapping"), MetadataValue::F32(cap));
            }
            if let Some(cap) = g.final_softcap {
                md.set(format!("{arch}.final_logit_softcapping"), MetadataValue::F32(cap));
            }
        }
        match self.rope {
            SyntheticRope::Plain => {}
            SyntheticRope::Yarn { factor, original_context } => {
                md.set(format!("{arch}.rope.scaling.type"), MetadataValue::String("yarn".into()));
                md.set(format!("{arch}.rope.scaling.factor"), MetadataValue::F32(factor));
                md.set(format!("{arch}.rope.scaling.original_context_length"), MetadataValue::U32(original_context));
            }
            SyntheticRope::LongShort { attn_factor, original_context } => {
                md.set(format!("{arch}.rope.scaling.attn_factor"), MetadataValue::F32(attn_factor));
                md.set(format!("{arch}.rope.scaling.original_context_length"), MetadataValue::U32(original_context));
            }
        }
        for (key, value) in tokenizer.iter() {
            md.set(key, value.clone());
        }
        md
    }

    /// The tensors in file order, each with its values (rows x cols, row-major) and type.
    fn tensors(&self, vocab: usize) -> Vec<(TensorSpec, Vec<f32>)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let (h, q, kv, f) = (self.hidden, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.ffn);
        let mut out = Vec::new();
        let matrix = |out: &mut Vec<_>, rng: &mut StdRng, name: String, rows: usize, cols: usize, std: f32| {
            let spec = TensorSpec { name, dims: vec![cols as u64, rows as u64], ggml_type: self.matrix_type };
            out.push((spec, uniform(rng, rows * cols, std)));
        };
        let vector = |out: &mut Vec<_>, rng: &mut StdRng, name: String, n: usize, mean: f32, std: f32| {
            let spec = TensorSpec { name, dims: vec![n as u64], ggml_type: GgmlType::F32 };
            out.push((spec, uniform(rng, n, std).into_iter().map(|v| v + mean).collect()));
        };
        // Embedding rows of unit scale; every product's weights of std 1/sqrt(cols), so each
        // output has about the scale of its input; the LM head of std 4/sqrt(hidden), so that the
        // logits spread over several units and most greedy steps have clear margins. A tied
        // embedding is that LM head (at unit scale its logits would reach +-100 and every
        // distribution would be one-hot, comparing nothing).
        let embedding_std = if self.untied_output { 1.0 } else { 4.0 / (h as f32).sqrt() };
        matrix(&mut out, &mut rng, "token_embd.weight".into(), vocab, h, embedding_std);
        if let SyntheticRope::LongShort { .. } = self.rope {
            // Shaped like Phi-3.5's: short factors near 1, long ones growing to ~8 for the
            // low frequencies.
            let pairs = self.head_dim / 2;
            let ramp = |top: f32| (0..pairs).map(move |i| 1.0 + (top - 1.0) * (i as f32 / (pairs - 1) as f32).powi(2)).collect();
            let vector_of = |name: &str| TensorSpec { name: name.into(), dims: vec![pairs as u64], ggml_type: GgmlType::F32 };
            out.push((vector_of("rope_factors_long.weight"), ramp(8.0)));
            out.push((vector_of("rope_factors_short.weight"), ramp(1.5)));
        }
        for l in 0..self.n_layers {
            let name = |s: &str| format!("blk.{l}.{s}");
            let std = |cols: usize| 1.0 / (cols as f32).sqrt();
            vector(&mut out, &mut rng, name("attn_norm.weight"), h, 1.0, 0.2);
            if self.fused_tensors {
                matrix(&mut out, &mut rng, name("attn_qkv.weight"), q + 2 * kv, h, std(h));
            } else {
                matrix(&mut out, &mut rng, name("attn_q.weight"), q, h, std(h));
                matrix(&mut out, &mut rng, name("attn_k.weight"), kv, h, std(h));
                matrix(&mut out, &mut rng, name("attn_v.weight"), kv, h, std(h));
            }
            if self.qkv_bias {
                vector(&mut out, &mut rng, name("attn_q.bias"), q, 0.0, 0.5);
                vector(&mut out, &mut rng, name("attn_k.bias"), kv, 0.0, 0.5);
                vector(&mut out, &mut rng, name("attn_v.bias"), kv, 0.0, 0.5);
            }
            if self.qk_norm {
                vector(&mut out, &mut rng, name("attn_q_norm.weight"), self.head_dim, 1.0, 0.2);
                vector(&mut out, &mut rng, name("attn_k_norm.weight"), self.head_dim, 1.0, 0.2);
            }
            matrix(&mut out, &mut rng, name("attn_output.weight"), h, q, std(q));
            if self.gemma.is_some() {
                vector(&mut out, &mut rng, name("post_attention_norm.weight"), h, 1.0, 0.2);
            }
            vector(&mut out, &mut rng, name("ffn_norm.weight"), h, 1.0, 0.2);
            if self.fused_tensors {
                matrix(&mut out, &mut rng, name("ffn_up.weight"), 2 * f, h, std(h));
            } else {
                matrix(&mut out, &mut rng, name("ffn_gate.weight"), f, h, std(h));
                matrix(&mut out, &mut rng, name("ffn_up.weight"), f, h, std(h));
            }
            matrix(&mut out, &mut rng, name("ffn_down.weight"), h, f, std(f));
            if self.gemma.is_some() {
                vector(&mut out, &mut rng, name("post_ffw_norm.weight"), h, 1.0, 0.2);
            }
        }
        vector(&mut out, &mut rng, "output_norm.weight".into(), h, 1.0, 0.2);
        if self.untied_output {
            matrix(&mut out, &mut rng, "output.weight".into(), vocab, h, 4.0 * (h as f32).sqrt().recip());
        }
        out
    }

    /// The file's name in the test target directory.
    pub fn file_name(&self) -> String {
        format!("synthetic-{}.gguf", self.reference_dir.trim_start_matches("reference-"))
    }

    /// Writes the model to the test target directory (unless a file with the expected sha256 is
    /// already there), checks its sha256 against the reference's, and returns its path; once per
    /// binary (`super::write_once`).
    pub fn write(&self) -> PathBuf {
        super::write_once(&self.file_name(), || self.write_checked())
    }

    fn write_checked(&self) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(self.file_name());
        if std::fs::read(&path).map(|bytes| sha256_hex(&bytes) == self.sha256).unwrap_or(false) {
            return path;
        }
        let sha = self.write_to(&path);
        assert_eq!(
            sha,
            self.sha256,
            "{}: the generator wrote {} with another sha256 than llama.cpp's reference was made from; \
             remake tests/data/{}/ (see its README)",
            self.label,
            path.display(),
            self.reference_dir
        );
        path
    }

    /// Writes the model to `path` and returns the file's sha256.
    pub fn write_to(&self, path: &std::path::Path) -> String {
        let tokenizer = tokenizer_metadata();
        let vocab = Self::vocab(&tokenizer);
        let tensors = self.tensors(vocab);
        let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
        let mut bytes = Vec::new();
        let mut writer = GgufWriter::new(&mut bytes, &self.metadata(&tokenizer), &specs).expect("write the header");
        for (spec, values) in &tensors {
            let data = kestrel_gguf::quantize(spec.ggml_type, values).expect("quantize a tensor");
            writer.write_tensor(&data).expect("write a tensor");
        }
        writer.finish().expect("finish the file");
        std::fs::write(path, &bytes).expect("write the synthetic model");
        sha256_hex(&bytes)
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `model`'s file with its chat template replaced by `template`, as bytes.
pub fn with_template_bytes(model: &SyntheticModel, template: &str) -> Vec<u8> {
    with_metadata_bytes(model, &[("tokenizer.chat_template".into(), MetadataValue::String(template.into()))])
}

/// `model`'s file with the metadata keys `set` added or replaced, as bytes.
pub fn with_metadata_bytes(model: &SyntheticModel, set: &[(String, MetadataValue)]) -> Vec<u8> {
    let (header, tensors) = kestrel_gguf::read_file(&model.write()).expect("read the synthetic model");
    let mut metadata = header.metadata.clone();
    for (key, value) in set {
        metadata.set(key, value.clone());
    }
    let specs: Vec<TensorSpec> =
        header.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type }).collect();
    let mut bytes = Vec::new();
    let mut writer = GgufWriter::new(&mut bytes, &metadata, &specs).expect("write the header");
    for data in &tensors {
        writer.write_tensor(data).expect("write a tensor");
    }
    writer.finish().expect("finish the file");
    bytes
}

/// The same, written to the test target directory as `file_name` (once per binary).
pub fn with_template(model: &SyntheticModel, template: &str, file_name: &str) -> PathBuf {
    super::write_once(file_name, || {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(file_name);
        std::fs::write(&path, with_template_bytes(model, template)).expect("write the model");
        path
    })
}

/// `model` as a decoder embedding model: `{arch}.pooling_type` set to `pooling` (last-token
/// pooling, 3, also asks for EOS after every input, as Qwen3-Embedding's files do, so the vector
/// pooled is that token's), written to the test target directory (once per binary). Returns its
/// path and its name (`<model>-pooling-<pooling>`).
pub fn pooled(model: &SyntheticModel, pooling: u32) -> (PathBuf, String) {
    let name = format!("{}-pooling-{pooling}", model.file_name().trim_end_matches(".gguf"));
    let path = super::write_once(&format!("{name}.gguf"), || {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.gguf"));
        let mut set = vec![(format!("{}.pooling_type", model.arch), MetadataValue::U32(pooling))];
        if pooling == 3 {
            set.push(("tokenizer.ggml.add_eos_token".into(), MetadataValue::Bool(true)));
        }
        std::fs::write(&path, with_metadata_bytes(model, &set)).expect("write the model");
        path
    });
    (path, name)
}
