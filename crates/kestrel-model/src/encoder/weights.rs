//! The tensors an encoder GGUF holds, under llama.cpp's names, checked against the config's
//! shapes before any of their bytes are used.

use std::collections::HashMap;

use kestrel_gguf::{GgufHeader, TensorInfo};

use super::config::{EncoderArch, EncoderConfig, Pooling};
use crate::error::{bad_model, ModelError};

/// What a tensor becomes once loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A product's weights (`CpuKernels::Matrix`), or the token table the rows are gathered from.
    Matrix,
    /// f32 values: norms, biases, and the small position and token-type tables.
    Values,
}

/// A tensor the encoder reads: its shape as rows x cols (vectors: one row) and what it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncoderTensor {
    pub rows: usize,
    pub cols: usize,
    pub kind: Kind,
}

/// The tensors of `config`'s model, by name: the required ones, and the optional biases and
/// token-type table where the header has them (llama.cpp's TENSOR_NOT_REQUIRED ones).
pub fn expected_tensors(config: &EncoderConfig, header: &GgufHeader) -> HashMap<String, EncoderTensor> {
    let has = |name: &str| header.tensors.iter().any(|t| t.name == name);
    let c = config;
    let mut out = HashMap::new();
    let mut add = |name: String, rows: usize, cols: usize, kind: Kind| {
        out.insert(name, EncoderTensor { rows, cols, kind });
    };
    let (h, f) = (c.hidden, c.ffn);
    add("token_embd.weight".into(), c.vocab, h, Kind::Matrix);
    if has("token_types.weight") {
        add("token_types.weight".into(), c.token_types, h, Kind::Values);
    }
    if c.arch == EncoderArch::Bert {
        add("position_embd.weight".into(), c.train_context, h, Kind::Values);
    }
    for part in ["weight", "bias"] {
        add(format!("token_embd_norm.{part}"), 1, h, Kind::Values);
    }
    if c.pooling == Pooling::Rank {
        // The classifier head: every part optional, as llama.cpp's bert reads it (a reranker
        // without `cls.output`, jina-reranker-v1-tiny, scores the head's first value).
        for (stem, rows) in [("cls", h), ("cls.output", c.n_cls_out)] {
            let (weight, bias) = (format!("{stem}.weight"), format!("{stem}.bias"));
            if has(&weight) {
                add(weight, rows, h, Kind::Matrix);
            }
            if has(&bias) {
                add(bias, 1, rows, Kind::Values);
            }
        }
    }
    for l in 0..c.n_layers {
        let name = |s: &str| format!("blk.{l}.{s}");
        let optional_bias = |stem: &str, width: usize, add: &mut dyn FnMut(String, usize, usize, Kind)| {
            let bias = name(&format!("{stem}.bias"));
            if has(&bias) {
                add(bias, 1, width, Kind::Values);
            }
        };
        if has(&name("attn_qkv.weight")) {
            add(name("attn_qkv.weight"), 3 * h, h, Kind::Matrix);
            optional_bias("attn_qkv", 3 * h, &mut add);
        } else {
            for stem in ["attn_q", "attn_k", "attn_v"] {
                add(name(&format!("{stem}.weight")), h, h, Kind::Matrix);
                optional_bias(stem, h, &mut add);
            }
        }
        add(name("attn_output.weight"), h, h, Kind::Matrix);
        optional_bias("attn_output", h, &mut add);
        add(name("ffn_up.weight"), f, h, Kind::Matrix);
        add(name("ffn_down.weight"), h, f, Kind::Matrix);
        match c.arch {
            // llama.cpp's BERT FFN takes the biases; nomic-bert's SwiGLU has none (it reads none
            // even where a file has them).
            EncoderArch::Bert => {
                optional_bias("ffn_up", f, &mut add);
                optional_bias("ffn_down", h, &mut add);
            }
            EncoderArch::NomicBert => add(name("ffn_gate.weight"), f, h, Kind::Matrix),
        }
        for norm in ["attn_output_norm", "layer_output_norm"] {
            for part in ["weight", "bias"] {
                add(name(&format!("{norm}.{part}")), 1, h, Kind::Values);
            }
        }
    }
    out
}

/// Checks a tensor's shape against what `expected` says of it (GGUF lists a matrix's dimensions
/// columns first); tensors the encoder does not read pass.
pub fn check_shape(expected: &HashMap<String, EncoderTensor>, info: &TensorInfo) -> Result<(), ModelError> {
    let Some(e) = expected.get(&info.name) else { return Ok(()) };
    // Trailing dimensions of 1 say nothing: a one-row table may be written as [cols, 1].
    let trim = |mut d: Vec<u64>| {
        while d.len() > 1 && d.last() == Some(&1) {
            d.pop();
        }
        d
    };
    let shape = trim(info.dims.clone());
    let want = trim(vec![e.cols as u64, e.rows as u64]);
    if shape != want {
        return Err(bad_model(format!("{}: shape {shape:?}, expected {want:?}", info.name)));
    }
    Ok(())
}

/// Checks that every expected tensor is among the model's (`names`, from all its headers).
pub fn check_complete<'a>(expected: &HashMap<String, EncoderTensor>, names: impl Iterator<Item = &'a str>) -> Result<(), ModelError> {
    let names: std::collections::HashSet<&str> = names.collect();
    let mut missing: Vec<&str> = expected.keys().map(String::as_str).filter(|n| !names.contains(n)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort_unstable();
    Err(bad_model(format!("missing tensors: {missing:?}")))
}
