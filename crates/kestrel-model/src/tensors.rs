//! The tensors a Llama-family GGUF holds, their names as llama.cpp writes them, and the shapes
//! the config implies. Both the GPU loader and the CPU reference check a file against this
//! before using any of its bytes.

use std::collections::HashMap;

use kestrel_gguf::{GgmlType, GgufHeader, TensorInfo};

use crate::config::{ModelConfig, ROPE_FACTORS_LONG_TENSOR, ROPE_FACTORS_SHORT_TENSOR, ROPE_FACTORS_TENSOR};
use crate::error::{bad_model, ModelError};

/// What one tensor of the model is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    TokenEmbedding,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    /// Q, K and V as one tensor of their concatenated rows (Phi-3).
    Qkv(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    QkvBias(usize),
    /// Qwen3's per-head RMSNorm weights of Q and of K (`head_dim` values each).
    QNorm(usize),
    KNorm(usize),
    AttnOutput(usize),
    /// Gemma's norms of the attention and FFN outputs, before their residual adds.
    AttnPostNorm(usize),
    FfnPostNorm(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    /// Gate and up as one tensor, gate rows first (Phi-3's `ffn_up`).
    GateUp(usize),
    Down(usize),
    /// Llama 3.1+'s RoPE frequency factors, one per pair of a head's dimensions.
    RopeFreqs,
    /// Phi-3's factors beyond the original context, and within it.
    RopeFactorsLong,
    RopeFactorsShort,
}

/// A tensor the model needs: its name and shape as rows x cols (vectors have rows = 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub role: Role,
    pub name: String,
    pub rows: usize,
    pub cols: usize,
}

/// The tensor whose RoPE frequency factors apply at a context of `max_ctx`: Llama 3's one
/// table, or Phi-3's long factors beyond the original context and short ones within it (as
/// llama.cpp chooses by its context length).
pub fn rope_factors_role(c: &ModelConfig, max_ctx: usize) -> Option<Role> {
    if c.rope_factors {
        Some(Role::RopeFreqs)
    } else if c.rope_long_short_factors {
        Some(if max_ctx > c.rope_original_context { Role::RopeFactorsLong } else { Role::RopeFactorsShort })
    } else {
        None
    }
}

/// Every tensor the config requires, in no particular order.
pub fn expected_tensors(c: &ModelConfig) -> Vec<Expected> {
    let q = c.q_width();
    let kv = c.kv_width();
    let mut out = vec![
        expected(Role::TokenEmbedding, "token_embd.weight", c.vocab, c.hidden),
        expected(Role::OutputNorm, "output_norm.weight", 1, c.hidden),
    ];
    if !c.tied_embeddings {
        out.push(expected(Role::Output, "output.weight", c.vocab, c.hidden));
    }
    if c.rope_factors {
        out.push(expected(Role::RopeFreqs, ROPE_FACTORS_TENSOR, 1, c.head_dim / 2));
    }
    if c.rope_long_short_factors {
        out.push(expected(Role::RopeFactorsLong, ROPE_FACTORS_LONG_TENSOR, 1, c.head_dim / 2));
        out.push(expected(Role::RopeFactorsShort, ROPE_FACTORS_SHORT_TENSOR, 1, c.head_dim / 2));
    }
    for l in 0..c.n_layers {
        let name = |s: &str| format!("blk.{l}.{s}");
        out.extend([
            expected(Role::AttnNorm(l), &name("attn_norm.weight"), 1, c.hidden),
            expected(Role::AttnOutput(l), &name("attn_output.weight"), c.hidden, q),
            expected(Role::FfnNorm(l), &name("ffn_norm.weight"), 1, c.hidden),
            expected(Role::Down(l), &name("ffn_down.weight"), c.hidden, c.ffn),
        ]);
        match (c.fused_qkv_tensor, c.qkv_bias) {
            (true, bias) => {
                out.push(expected(Role::Qkv(l), &name("attn_qkv.weight"), c.qkv_width(), c.hidden));
                if bias {
                    out.push(expected(Role::QkvBias(l), &name("attn_qkv.bias"), 1, c.qkv_width()));
                }
            }
            (false, bias) => {
                out.extend([
                    expected(Role::Q(l), &name("attn_q.weight"), q, c.hidden),
                    expected(Role::K(l), &name("attn_k.weight"), kv, c.hidden),
                    expected(Role::V(l), &name("attn_v.weight"), kv, c.hidden),
                ]);
                if bias {
                    out.extend([
                        expected(Role::QBias(l), &name("attn_q.bias"), 1, q),
                        expected(Role::KBias(l), &name("attn_k.bias"), 1, kv),
                        expected(Role::VBias(l), &name("attn_v.bias"), 1, kv),
                    ]);
                }
            }
        }
        if c.post_norms {
            out.extend([
                expected(Role::AttnPostNorm(l), &name("post_attention_norm.weight"), 1, c.hidden),
                expected(Role::FfnPostNorm(l), &name("post_ffw_norm.weight"), 1, c.hidden),
            ]);
        }
        if c.qk_norm {
            out.extend([
                expected(Role::QNorm(l), &name("attn_q_norm.weight"), 1, c.head_dim),
                expected(Role::KNorm(l), &name("attn_k_norm.weight"), 1, c.head_dim),
            ]);
        }
        if c.fused_gate_up_tensor {
            out.push(expected(Role::GateUp(l), &name("ffn_up.weight"), 2 * c.ffn, c.hidden));
        } else {
            out.extend([
                expected(Role::Gate(l), &name("ffn_gate.weight"), c.ffn, c.hidden),
                expected(Role::Up(l), &name("ffn_up.weight"), c.ffn, c.hidden),
            ]);
        }
    }
    out
}

fn expected(role: Role, name: &str, rows: usize, cols: usize) -> Expected {
    Expected { role, name: name.to_string(), rows, cols }
}

/// Matches a file's tensors to the roles the model expects (`expected_tensors`), by name, with
/// each one's shape checked; the file's other tensors get no role. Whole: `assign_roles`.
pub fn assign_roles(header: &GgufHeader, config: &ModelConfig) -> Result<Vec<Option<Expected>>, ModelError> {
    let mut roles = RoleAssigner::new(config);
    roles.add(&header.tensors)?;
    roles.finish()
}

/// `assign_roles` for tensor descriptors that arrive in parts: the shards of a split model, each
/// header as it comes.
pub struct RoleAssigner {
    /// In the model's order, which the missing-tensor error follows.
    expected: Vec<Expected>,
    by_name: HashMap<String, usize>,
    found: Vec<bool>,
    roles: Vec<Option<Expected>>,
}

impl RoleAssigner {
    pub fn new(config: &ModelConfig) -> Self {
        let expected = expected_tensors(config);
        let by_name = expected.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        Self { found: vec![false; expected.len()], expected, by_name, roles: Vec::new() }
    }

    /// The next tensors of the file, in its order: their roles, indexed from the first tensor of
    /// the first part.
    pub fn add(&mut self, tensors: &[TensorInfo]) -> Result<(), ModelError> {
        for info in tensors {
            let role = match self.by_name.get(&info.name) {
                Some(&i) => {
                    let e = self.expected.get(i).ok_or_else(|| bad_model(format!("no role {i}")))?;
                    check_shape(info, e)?;
                    if let Some(found) = self.found.get_mut(i) {
                        *found = true;
                    }
                    Some(e.clone())
                }
                None => None,
            };
            self.roles.push(role);
        }
        Ok(())
    }

    /// The roles so far, indexed like the tensors added.
    pub fn roles(&self) -> &[Option<Expected>] {
        &self.roles
    }

    /// Tensors the model uses.
    pub fn expected_count(&self) -> usize {
        self.expected.len()
    }

    /// Ok once every expected tensor has been added; else the first that never came, as an error.
    pub fn check_complete(&self) -> Result<(), ModelError> {
        match self.expected.iter().zip(&self.found).find(|(_, &found)| !found) {
            Some((e, _)) => Err(bad_model(format!("missing tensor {}", e.name))),
            None => Ok(()),
        }
    }

    /// Every tensor's role, once `check_complete` passed.
    pub fn finish(self) -> Result<Vec<Option<Expected>>, ModelError> {
        self.check_complete()?;
        Ok(self.roles)
    }
}

/// Whether the GPU path runs `info` in its role: vectors (norms, biases) as f32 or f16, matrices
/// in any type the matmul kernels read.
pub fn gpu_runs(e: &Expected, info: &TensorInfo) -> bool {
    if e.rows == 1 {
        matches!(info.ggml_type, GgmlType::F32 | GgmlType::F16)
    } else {
        kestrel_gpu::layout::is_gpu_supported(info.ggml_type)
    }
}

fn check_shape(info: &TensorInfo, e: &Expected) -> Result<(), ModelError> {
    let dims: Vec<u64> = info.dims.iter().copied().filter(|&d| d != 1).collect();
    let want: Vec<u64> = [e.cols as u64, e.rows as u64].into_iter().filter(|&d| d != 1).collect();
    if dims != want {
        return Err(bad_model(format!(
            "tensor {} has shape {:?}, the model's metadata implies [{}, {}]",
            e.name, info.dims, e.cols, e.rows
        )));
    }
    Ok(())
}
