//! Small random-weight encoders (`bert`, `nomic-bert`) written with Kestrel's GGUF writer: the
//! architecture's real metadata keys and tensor names, seeded random weights in a given type,
//! and the vocabulary of the real all-MiniLM-L6-v2 file (its WordPiece tokens and special ids).
//! llama.cpp embeds with such a file as with a trained one, so the tests compare the two engines'
//! vectors on it for each architecture and pooling type. Also the random-weight BERT reranker
//! (`RERANKER`) and llama.cpp's scores on it (`rank_with_llama_cpp`), which kestrel-cli's tests
//! include this file for.

use std::path::{Path, PathBuf};

use kestrel_gguf::{GgmlType, GgufWriter, Metadata, MetadataValue, TensorSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
pub struct SyntheticEncoder {
    pub arch: &'static str,
    /// llama.cpp's `pooling_type`: 1 mean, 2 cls, 3 last, 4 rank (a reranker: the file also
    /// gets the classifier head, `cls` and `cls.output` with one output).
    pub pooling_type: u32,
    /// Type of every matrix, the token table included.
    pub matrix_type: GgmlType,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub ffn: usize,
    pub context: usize,
    pub seed: u64,
}

/// One file of each architecture and pooling type, each with another matrix type: BERT with CLS
/// pooling and Q8_0, BERT with last-token pooling and F16, nomic-bert (RoPE, SwiGLU, fused
/// Q|K|V) with mean pooling and Q4_0. The file name has no seed: every test that writes one
/// writes the same bytes.
// Unused by kestrel-cli's tests, which include this file for the reranker.
#[allow(dead_code)]
pub const EVERY_ARCHITECTURE: [SyntheticEncoder; 3] = [
    SyntheticEncoder {
        arch: "bert",
        pooling_type: 2,
        matrix_type: GgmlType::Q8_0,
        n_layers: 2,
        hidden: 64,
        n_heads: 4,
        ffn: 128,
        context: 128,
        seed: 11,
    },
    SyntheticEncoder {
        arch: "bert",
        pooling_type: 3,
        matrix_type: GgmlType::F16,
        n_layers: 2,
        hidden: 64,
        n_heads: 2,
        ffn: 256,
        context: 64,
        seed: 12,
    },
    SyntheticEncoder {
        arch: "nomic-bert",
        pooling_type: 1,
        matrix_type: GgmlType::Q4_0,
        n_layers: 3,
        hidden: 128,
        n_heads: 4,
        ffn: 256,
        context: 128,
        seed: 13,
    },
];

impl SyntheticEncoder {
    pub fn file_name(&self) -> String {
        format!("synthetic-{}-pool{}-{}.gguf", self.arch, self.pooling_type, self.matrix_type.name().to_lowercase())
    }

    /// Writes the model next to the tests' other outputs, with `vocabulary` (a GGUF file whose
    /// `tokenizer.*` keys it copies), and returns its path.
    pub fn write(&self, vocabulary: &Path) -> PathBuf {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(self.file_name());
        let header = kestrel_gguf::parse_header(&std::fs::read(vocabulary).expect("read the vocabulary's file")).expect("its header");
        let mut md = Metadata::new();
        let arch = self.arch;
        let u32v = |v: usize| MetadataValue::U32(u32::try_from(v).expect("a small shape"));
        md.set("general.architecture", MetadataValue::String(arch.into()));
        md.set("general.name", MetadataValue::String(format!("synthetic {arch}")));
        md.set(format!("{arch}.context_length"), u32v(self.context));
        md.set(format!("{arch}.embedding_length"), u32v(self.hidden));
        md.set(format!("{arch}.feed_forward_length"), u32v(self.ffn));
        md.set(format!("{arch}.attention.head_count"), u32v(self.n_heads));
        md.set(format!("{arch}.block_count"), u32v(self.n_layers));
        md.set(format!("{arch}.attention.layer_norm_epsilon"), MetadataValue::F32(1e-12));
        md.set(format!("{arch}.attention.causal"), MetadataValue::Bool(false));
        md.set(format!("{arch}.pooling_type"), MetadataValue::U32(self.pooling_type));
        if arch == "nomic-bert" {
            md.set(format!("{arch}.rope.freq_base"), MetadataValue::F32(1000.0));
        }
        for (key, value) in header.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
            md.set(key, value.clone());
        }
        let vocab = header.metadata.get_string_array("tokenizer.ggml.tokens").expect("tokens").expect("a vocabulary").len();
        let tensors = self.tensors(vocab);
        let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
        let mut bytes = Vec::new();
        let mut writer = GgufWriter::new(&mut bytes, &md, &specs).expect("write the header");
        for (spec, values) in &tensors {
            writer.write_tensor(&kestrel_gguf::quantize(spec.ggml_type, values).expect("quantize a tensor")).expect("write a tensor");
        }
        writer.finish().expect("finish the file");
        std::fs::write(&path, &bytes).expect("write the synthetic encoder");
        path
    }

    /// The tensors with their values (rows x cols, row-major). Products' weights have std
    /// 1/sqrt(cols), so each output has about its input's scale; norms are near 1 and biases
    /// small, as in a trained model.
    fn tensors(&self, vocab: usize) -> Vec<(TensorSpec, Vec<f32>)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let (h, f) = (self.hidden, self.ffn);
        let nomic = self.arch == "nomic-bert";
        let mut out = Vec::new();
        let matrix = |out: &mut Vec<_>, rng: &mut StdRng, name: String, rows: usize, cols: usize, ty: GgmlType| {
            let std = 1.0 / (cols as f32).sqrt();
            out.push((TensorSpec { name, dims: vec![cols as u64, rows as u64], ggml_type: ty }, uniform(rng, rows * cols, std, 0.0)));
        };
        let vector = |out: &mut Vec<_>, rng: &mut StdRng, name: String, n: usize, mean: f32, std: f32| {
            out.push((TensorSpec { name, dims: vec![n as u64], ggml_type: GgmlType::F32 }, uniform(rng, n, std, mean)));
        };
        let ty = self.matrix_type;
        matrix(&mut out, &mut rng, "token_embd.weight".into(), vocab, h, ty);
        matrix(&mut out, &mut rng, "token_types.weight".into(), 2, h, GgmlType::F32);
        if !nomic {
            matrix(&mut out, &mut rng, "position_embd.weight".into(), self.context, h, GgmlType::F32);
        }
        vector(&mut out, &mut rng, "token_embd_norm.weight".into(), h, 1.0, 0.2);
        vector(&mut out, &mut rng, "token_embd_norm.bias".into(), h, 0.0, 0.1);
        for l in 0..self.n_layers {
            let name = |s: &str| format!("blk.{l}.{s}");
            if nomic {
                matrix(&mut out, &mut rng, name("attn_qkv.weight"), 3 * h, h, ty);
            } else {
                for p in ["attn_q", "attn_k", "attn_v"] {
                    matrix(&mut out, &mut rng, name(&format!("{p}.weight")), h, h, ty);
                    vector(&mut out, &mut rng, name(&format!("{p}.bias")), h, 0.0, 0.1);
                }
            }
            matrix(&mut out, &mut rng, name("attn_output.weight"), h, h, ty);
            if !nomic {
                vector(&mut out, &mut rng, name("attn_output.bias"), h, 0.0, 0.1);
            }
            vector(&mut out, &mut rng, name("attn_output_norm.weight"), h, 1.0, 0.2);
            vector(&mut out, &mut rng, name("attn_output_norm.bias"), h, 0.0, 0.1);
            matrix(&mut out, &mut rng, name("ffn_up.weight"), f, h, ty);
            if nomic {
                matrix(&mut out, &mut rng, name("ffn_gate.weight"), f, h, ty);
            } else {
                vector(&mut out, &mut rng, name("ffn_up.bias"), f, 0.0, 0.1);
            }
            matrix(&mut out, &mut rng, name("ffn_down.weight"), h, f, ty);
            if !nomic {
                vector(&mut out, &mut rng, name("ffn_down.bias"), h, 0.0, 0.1);
            }
            vector(&mut out, &mut rng, name("layer_output_norm.weight"), h, 1.0, 0.2);
            vector(&mut out, &mut rng, name("layer_output_norm.bias"), h, 0.0, 0.1);
        }
        if self.pooling_type == 4 {
            matrix(&mut out, &mut rng, "cls.weight".into(), h, h, ty);
            vector(&mut out, &mut rng, "cls.bias".into(), h, 0.0, 0.1);
            // Three times the products' scale: logits of a few units, so that the sigmoid's
            // probabilities spread over (0, 1) rather than all sitting near 0.5.
            let std = 3.0 / (h as f32).sqrt();
            out.push((
                TensorSpec { name: "cls.output.weight".into(), dims: vec![h as u64, 1], ggml_type: ty },
                uniform(&mut rng, h, std, 0.0),
            ));
            vector(&mut out, &mut rng, "cls.output.bias".into(), 1, 0.0, 0.5);
        }
        out
    }
}

/// `n` values uniform around `mean` with standard deviation `std`.
/// The random-weight BERT reranker (rank pooling, F32) the tests compare with llama.cpp.
pub const RERANKER: SyntheticEncoder = SyntheticEncoder {
    arch: "bert",
    pooling_type: 4,
    matrix_type: GgmlType::F32,
    n_layers: 2,
    hidden: 64,
    n_heads: 4,
    ffn: 128,
    context: 128,
    seed: 21,
};

/// Scores `documents` against `query` with llama.cpp on the reranker at `model`
/// (`tools/llama-cpp/embed.mjs --rank`, node-llama-cpp's `rankAll`): the path of the JSON it
/// writes next to the model, `{query, cases: [{document, tokens, score}]}`.
pub fn rank_with_llama_cpp(model: &Path, query: &str, documents: &[&str]) -> PathBuf {
    let name = model.file_name().expect("a model file").to_string_lossy().into_owned();
    let dir = model.parent().expect("the model's directory");
    let input = dir.join(format!("{name}.query-docs.json"));
    std::fs::write(&input, serde_json::json!({ "query": query, "documents": documents }).to_string()).expect("write the pairs");
    let out = dir.join(format!("{name}.rank.json"));
    let run = std::process::Command::new("node")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/llama-cpp"))
        .arg("embed.mjs")
        .arg(model)
        .arg("--rank")
        .arg(&input)
        .arg(&out)
        .output()
        .expect("run node tools/llama-cpp/embed.mjs --rank");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    out
}

fn uniform(rng: &mut StdRng, n: usize, std: f32, mean: f32) -> Vec<f32> {
    let half_width = std * 3f32.sqrt();
    (0..n).map(|_| mean + rng.random_range(-half_width..half_width)).collect()
}
