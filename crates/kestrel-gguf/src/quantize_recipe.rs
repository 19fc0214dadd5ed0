//! Which type each tensor gets when a model is quantized, following llama.cpp's
//! `src/llama-quant.cpp` (`llama_model_quantize_impl` for which tensors are quantized,
//! `llama_tensor_get_type` for the Q4_K_M mix and the fallback of rows that are not whole
//! K-quant super-blocks). Only the rules that apply to dense llama / qwen2 models are
//! implemented: no MoE experts, no fused attn_qkv, no 70B-specific attn_v bump, no Falcon.

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::tensor::TensorInfo;
use crate::types::GgmlType;

/// What `quantize_model` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizeTarget {
    /// Every quantizable tensor as this type (llama-quantize's `--pure`): F32, F16, Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K.
    Type(GgmlType),
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output matrix and for the attn_v and
    /// ffn_down matrices of the layers `use_more_bits` picks.
    Q4KM,
}

impl From<GgmlType> for QuantizeTarget {
    fn from(ty: GgmlType) -> Self {
        QuantizeTarget::Type(ty)
    }
}

impl QuantizeTarget {
    /// llama.cpp's LLAMA_FTYPE (llama.h), written as `general.file_type`; an error for a
    /// type that is not a supported target.
    pub(crate) fn file_type(self) -> Result<u32, GgufError> {
        use GgmlType::*;
        match self {
            QuantizeTarget::Q4KM => Ok(15),
            QuantizeTarget::Type(ty) => match ty {
                F32 => Ok(0),
                F16 => Ok(1),
                Q4_0 => Ok(2),
                Q4_1 => Ok(3),
                Q8_0 => Ok(7),
                Q5_0 => Ok(8),
                Q5_1 => Ok(9),
                // A pure K-quant file is labelled as the _S variant of its type.
                Q4_K => Ok(14),
                Q5_K => Ok(16),
                Q6_K => Ok(18),
                _ => Err(GgufError::UnsupportedType { ty, operation: "model quantization" }),
            },
        }
    }
}

/// The type a tensor is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub ty: GgmlType,
    /// The type the recipe wanted did not fit the row length (see `fit_row_length`).
    pub fallback: bool,
}

/// llama.cpp's `quantize` flag: only weight matrices are quantized; norms, biases and 1-D
/// tensors keep their type, and so do an encoder's position and token-type tables (ggml adds
/// them to f32 rows, which it cannot do from a quantized table).
fn is_quantized(t: &TensorInfo) -> bool {
    // ggml_n_dims ignores trailing dimensions of 1.
    let n_dims = t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    t.name.ends_with("weight")
        && n_dims >= 2
        && !t.name.contains("_norm.weight")
        && !matches!(t.name.as_str(), "position_embd.weight" | "token_types.weight")
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// layer in between. (The subtraction only runs once i_layer >= n_layers / 8.)
fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// The row length does not fit `ty`'s blocks: llama.cpp swaps a K-quant for the legacy type
/// of about the same size, then (like this crate for every other type) falls back to F16.
fn fit_row_length(ty: GgmlType, cols: u64) -> Choice {
    if cols.is_multiple_of(ty.block_size()) {
        return Choice { ty, fallback: false };
    }
    let legacy = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    };
    let ty = if cols.is_multiple_of(legacy.block_size()) { legacy } else { GgmlType::F16 };
    Choice { ty, fallback: true }
}

/// llama.cpp's tensor order while it picks types (`weight_name_comparer`): by the layer
/// number of "blk.N." names (others first), then by name. The recipe's attn_v and ffn_down
/// counters advance in this order.
fn llama_order(name: &str) -> (i64, &str) {
    let layer = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()).and_then(|n| n.parse().ok()).unwrap_or(-1);
    (layer, name)
}

/// The output type of every tensor of `tensors` (same order).
pub(crate) fn plan(metadata: &Metadata, tensors: &[TensorInfo], target: QuantizeTarget) -> Result<Vec<Choice>, GgufError> {
    let keep = |t: &TensorInfo| Choice { ty: t.ggml_type, fallback: false };
    let cols = |t: &TensorInfo| t.dims.first().copied().unwrap_or(1);
    match target {
        QuantizeTarget::Type(ty) => {
            Ok(tensors.iter().map(|t| if is_quantized(t) { fit_row_length(ty, cols(t)) } else { keep(t) }).collect())
        }
        QuantizeTarget::Q4KM => {
            let n_layers = block_count(metadata)?;
            let n_attention_wv = tensors.iter().filter(|t| t.name.contains("attn_v.weight")).count();
            let has_output = tensors.iter().any(|t| t.name == "output.weight");
            let mut order: Vec<usize> = (0..tensors.len()).collect();
            order.sort_by(|&a, &b| {
                let name = |i: usize| tensors.get(i).map_or("", |t| t.name.as_str());
                llama_order(name(a)).cmp(&llama_order(name(b)))
            });
            let mut choices: Vec<Choice> = tensors.iter().map(keep).collect();
            let (mut i_attention_wv, mut i_ffn_down) = (0, 0);
            for i in order {
                let (Some(t), Some(choice)) = (tensors.get(i), choices.get_mut(i)) else {
                    continue;
                };
                if !is_quantized(t) {
                    continue;
                }
                let name = t.name.as_str();
                let ty = if name == "output.weight" || (!has_output && name == "token_embd.weight") {
                    // Tied embeddings are also the output matrix. Q8_0 when the row is not
                    // whole super-blocks (llama.cpp decides this before the fallback).
                    if cols(t).is_multiple_of(256) {
                        GgmlType::Q6_K
                    } else {
                        GgmlType::Q8_0
                    }
                } else if name.contains("attn_v.weight") {
                    i_attention_wv += 1;
                    more_bits(i_attention_wv - 1, n_attention_wv)
                } else if name.contains("ffn_down") {
                    i_ffn_down += 1;
                    more_bits(i_ffn_down - 1, n_layers)
                } else {
                    GgmlType::Q4_K
                };
                *choice = fit_row_length(ty, cols(t));
            }
            Ok(choices)
        }
    }
}

fn more_bits(i_layer: usize, n_layers: usize) -> GgmlType {
    if use_more_bits(i_layer, n_layers) {
        GgmlType::Q6_K
    } else {
        GgmlType::Q4_K
    }
}

/// `{general.architecture}.block_count`, llama.cpp's n_layer, which the ffn_down rule
/// divides into eighths.
fn block_count(metadata: &Metadata) -> Result<usize, GgufError> {
    let missing = |key: &str| GgufError::MetadataValue {
        key: key.to_string(),
        reason: "missing; the Q4_K_M recipe needs the layer count".to_string(),
    };
    let arch_key = "general.architecture";
    let arch = metadata.get_str(arch_key)?.ok_or_else(|| missing(arch_key))?;
    let key = format!("{arch}.block_count");
    let n = metadata.get_u64(&key)?.ok_or_else(|| missing(&key))?;
    usize::try_from(n).map_err(|_| GgufError::MetadataValue { key, reason: format!("{n} layers is more than this platform can index") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::MetadataValue;
    use GgmlType::*;

    fn tensor(name: &str, dims: &[u64]) -> TensorInfo {
        TensorInfo { name: name.to_string(), dims: dims.to_vec(), ggml_type: if dims.len() == 1 { F32 } else { F16 }, offset: 0 }
    }

    /// A llama-architecture tensor list: `n_layers` layers, hidden size `n_embd`, feed-forward
    /// size `n_ff`, 3 KV heads of 64, tied embeddings unless `output` is set.
    fn model(n_layers: u32, n_embd: u64, n_ff: u64, output: bool) -> (Metadata, Vec<TensorInfo>) {
        let mut m = Metadata::new();
        m.set("general.architecture", MetadataValue::String("llama".into()));
        m.set("llama.block_count", MetadataValue::U32(n_layers));
        let mut t = vec![tensor("token_embd.weight", &[n_embd, 49152])];
        for i in 0..n_layers {
            let name = |s: &str| format!("blk.{i}.{s}");
            t.push(tensor(&name("attn_norm.weight"), &[n_embd]));
            t.push(tensor(&name("attn_q.weight"), &[n_embd, n_embd]));
            t.push(tensor(&name("attn_k.weight"), &[n_embd, 192]));
            t.push(tensor(&name("attn_v.weight"), &[n_embd, 192]));
            t.push(tensor(&name("attn_output.weight"), &[n_embd, n_embd]));
            t.push(tensor(&name("ffn_norm.weight"), &[n_embd]));
            t.push(tensor(&name("ffn_gate.weight"), &[n_embd, n_ff]));
            t.push(tensor(&name("ffn_up.weight"), &[n_embd, n_ff]));
            t.push(tensor(&name("ffn_down.weight"), &[n_ff, n_embd]));
        }
        t.push(tensor("output_norm.weight", &[n_embd]));
        if output {
            t.push(tensor("output.weight", &[n_embd, 49152]));
        }
        (m, t)
    }

    fn type_of(tensors: &[TensorInfo], choices: &[Choice], name: &str) -> Choice {
        let i = tensors.iter().position(|t| t.name == name).unwrap();
        choices[i]
    }

    /// llama.cpp's use_more_bits for 30 layers: layers 0-2 and 26-29, and (i - 3) % 3 == 2.
    const MORE_BITS_30: [u32; 14] = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29];

    #[test]
    fn q4_k_m_for_smollm2_135m() {
        // 576 is not a multiple of 256, so every matrix with rows of 576 falls back, as in
        // llama.cpp's own Q4_K_M of this model; ffn_down (rows of 1536) does not.
        let (m, t) = model(30, 576, 1536, false);
        let c = plan(&m, &t, QuantizeTarget::Q4KM).unwrap();
        let at = |name: &str| type_of(&t, &c, name);
        let plain = |ty| Choice { ty, fallback: false };
        let fell_back = |ty| Choice { ty, fallback: true };
        // Tied embeddings are the output matrix: Q6_K wanted, Q8_0 for rows of 576.
        assert_eq!(at("token_embd.weight"), plain(Q8_0));
        assert_eq!(at("output_norm.weight"), plain(F32));
        for i in 0..30 {
            let more = MORE_BITS_30.contains(&i);
            let name = |s: &str| format!("blk.{i}.{s}");
            assert_eq!(at(&name("attn_norm.weight")), plain(F32));
            assert_eq!(at(&name("ffn_norm.weight")), plain(F32));
            for s in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
                assert_eq!(at(&name(&format!("{s}.weight"))), fell_back(Q5_0), "{i} {s}");
            }
            let v = if more { fell_back(Q8_0) } else { fell_back(Q5_0) };
            assert_eq!(at(&name("attn_v.weight")), v, "layer {i}");
            let down = if more { plain(Q6_K) } else { plain(Q4_K) };
            assert_eq!(at(&name("ffn_down.weight")), down, "layer {i}");
        }
    }

    #[test]
    fn q4_k_m_with_whole_super_blocks_and_an_output_matrix() {
        let (m, mut t) = model(30, 1024, 2816, true);
        // The counters follow llama.cpp's (layer, name) order, not the file's.
        t.reverse();
        let c = plan(&m, &t, QuantizeTarget::Q4KM).unwrap();
        let at = |name: &str| type_of(&t, &c, name).ty;
        assert_eq!(at("output.weight"), Q6_K);
        assert_eq!(at("token_embd.weight"), Q4_K);
        for i in 0..30 {
            let more = MORE_BITS_30.contains(&i);
            let want = if more { Q6_K } else { Q4_K };
            assert_eq!(at(&format!("blk.{i}.attn_v.weight")), want, "layer {i}");
            assert_eq!(at(&format!("blk.{i}.ffn_down.weight")), want, "layer {i}");
            assert_eq!(at(&format!("blk.{i}.attn_q.weight")), Q4_K);
            assert_eq!(at(&format!("blk.{i}.ffn_up.weight")), Q4_K);
        }
        assert!(c.iter().all(|c| !c.fallback));
    }

    #[test]
    fn pure_targets_and_their_fallbacks() {
        let (m, t) = model(2, 576, 1536, false);
        let ty_of = |target: GgmlType, name: &str| {
            let c = plan(&m, &t, QuantizeTarget::Type(target)).unwrap();
            type_of(&t, &c, name)
        };
        for (target, rows_576, rows_1536) in
            [(Q4_K, Q5_0, Q4_K), (Q5_K, Q5_1, Q5_K), (Q6_K, Q8_0, Q6_K), (Q5_0, Q5_0, Q5_0), (Q8_0, Q8_0, Q8_0)]
        {
            assert_eq!(ty_of(target, "blk.1.attn_q.weight").ty, rows_576, "{target}");
            assert_eq!(ty_of(target, "blk.1.ffn_down.weight").ty, rows_1536);
            assert_eq!(ty_of(target, "blk.1.ffn_norm.weight").ty, F32);
        }
        // Rows that are not even whole 32-blocks: F16.
        let odd = [tensor("x.weight", &[48, 4])];
        assert_eq!(plan(&m, &odd, Q4_K.into()).unwrap(), [Choice { ty: F16, fallback: true }]);
    }

    #[test]
    fn use_more_bits_matches_llama_cpp() {
        let picked: Vec<u32> = (0..30).filter(|&i| use_more_bits(i as usize, 30)).collect();
        assert_eq!(picked, MORE_BITS_30);
        // 4 layers: n/8 = 0, 7n/8 = 3, so layers 2 and 3.
        let picked: Vec<usize> = (0..4).filter(|&i| use_more_bits(i, 4)).collect();
        assert_eq!(picked, [2, 3]);
    }

    #[test]
    fn q4_k_m_needs_the_layer_count() {
        let (mut m, t) = model(2, 256, 512, false);
        m.set("llama.block_count", MetadataValue::String("two".into()));
        assert!(plan(&m, &t, QuantizeTarget::Q4KM).is_err());
        let e = plan(&Metadata::new(), &t, QuantizeTarget::Q4KM).unwrap_err();
        assert!(matches!(e, GgufError::MetadataValue { .. }), "{e}");
        assert!(matches!(QuantizeTarget::Type(Q2_K).file_type(), Err(GgufError::UnsupportedType { ty: Q2_K, .. })));
        assert_eq!(QuantizeTarget::Q4KM.file_type().unwrap(), 15);
    }
}
