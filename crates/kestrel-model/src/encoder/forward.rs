//! An encoder's forward pass over a set of CPU kernels (`CpuKernels`: the f32 reference or the
//! CPU backend's quantized products), as llama.cpp's `bert` graph computes it: post-norm layers,
//! bidirectional attention within each input, and pooling. Every input of a call is packed into
//! one pass: each product runs once over all their tokens, and attention stays within an input.

use std::collections::HashMap;
use std::ops::Range;

use kestrel_cpu::for_row_chunks;
use kestrel_gguf::GgmlType;
use kestrel_ops::params::{GateActivation, RopeConfig, RopeMode};
use kestrel_ops::reference::rope;

use super::config::{EncoderArch, EncoderConfig, Pooling};
use super::gelu::gelu_in_place;
use super::weights::{EncoderTensor, Kind};
use crate::cpu_forward::CpuKernels;
use crate::error::{bad_model, ModelError};

/// Q, K and V: one fused product (nomic-bert) or three.
pub(super) enum Qkv<M> {
    Fused { w: M, bias: Option<Vec<f32>> },
    Split { w: [M; 3], bias: [Option<Vec<f32>>; 3] },
}

/// One layer's weights, whichever backend holds the matrices (the GPU pass uploads the rest).
pub(super) struct Layer<M> {
    pub(super) qkv: Qkv<M>,
    pub(super) attn_output: M,
    pub(super) attn_output_bias: Option<Vec<f32>>,
    pub(super) attn_norm: [Vec<f32>; 2],
    pub(super) up: M,
    pub(super) up_bias: Option<Vec<f32>>,
    /// SwiGLU's gate (nomic-bert); none: BERT's GELU of `up`.
    pub(super) gate: Option<M>,
    pub(super) down: M,
    pub(super) down_bias: Option<Vec<f32>>,
    pub(super) output_norm: [Vec<f32>; 2],
}

/// One product of the classifier head, `W x + b`.
struct Dense<M> {
    w: M,
    bias: Option<Vec<f32>>,
}

/// A reranker's classifier head (rank pooling), each part optional as llama.cpp reads it:
/// `tanh(cls x + b)`, then `cls.output x + b`.
struct RankHead<M> {
    cls: Option<Dense<M>>,
    output: Option<Dense<M>>,
}

/// The loaded tensors of an encoder, as `EncoderLoading` collects them.
pub struct EncoderTensors<M> {
    pub matrices: HashMap<String, M>,
    pub values: HashMap<String, Vec<f32>>,
}

impl<M> Default for EncoderTensors<M> {
    fn default() -> Self {
        Self { matrices: HashMap::new(), values: HashMap::new() }
    }
}

impl<M> EncoderTensors<M> {
    /// Adds tensor `name` of the shape and kind `expected` says, from its GGUF bytes.
    pub fn add<K: CpuKernels<Matrix = M>>(&mut self, name: &str, e: &EncoderTensor, ty: GgmlType, bytes: &[u8]) -> Result<(), ModelError> {
        match e.kind {
            Kind::Matrix => {
                self.matrices.insert(name.to_string(), K::matrix(ty, bytes, e.rows, e.cols)?);
            }
            Kind::Values => {
                let mut values = vec![0.0; e.rows * e.cols];
                kestrel_gguf::dequantize(ty, bytes, &mut values)?;
                self.values.insert(name.to_string(), values);
            }
        }
        Ok(())
    }
}

pub struct Encoder<K: CpuKernels> {
    pub config: EncoderConfig,
    token_embd: K::Matrix,
    /// The token-type table: its row 0 is added to every token (llama.cpp: "sentence A").
    token_types: Option<Vec<f32>>,
    /// `[train_context][hidden]` (BERT's learned positions; nomic-bert rotates instead).
    positions: Option<Vec<f32>>,
    embd_norm: [Vec<f32>; 2],
    layers: Vec<Layer<K::Matrix>>,
    rope: Option<RopeConfig>,
    /// Rank pooling's classifier head; None for an embedding model. Boxed so that an `Embedder`
    /// stays about a chat `Model`'s size, which `LoadedModel` holds inline.
    head: Option<Box<RankHead<K::Matrix>>>,
}

impl<K: CpuKernels> Encoder<K> {
    pub fn from_tensors(config: EncoderConfig, tensors: EncoderTensors<K::Matrix>) -> Result<Self, ModelError> {
        let EncoderTensors { mut matrices, mut values } = tensors;
        let layers = take_layers(&config, &mut matrices, &mut values)?;
        Self::with_layers(config, EncoderTensors { matrices, values }, layers)
    }

    /// The encoder's ends (embeddings, their norm, the rank head) from `tensors`, around
    /// `layers`: the GPU pass keeps the ends on the host with no layers (`take_layers` took
    /// its own from its matrices).
    pub(super) fn with_layers(
        config: EncoderConfig,
        tensors: EncoderTensors<K::Matrix>,
        layers: Vec<Layer<K::Matrix>>,
    ) -> Result<Self, ModelError> {
        let EncoderTensors { mut matrices, mut values } = tensors;
        let head_matrices =
            (config.pooling == Pooling::Rank).then(|| (matrices.remove("cls.weight"), matrices.remove("cls.output.weight")));
        let token_embd = matrices.remove("token_embd.weight").ok_or_else(|| bad_model("tensor token_embd.weight never arrived"))?;
        let mut take = |name: &str| values.remove(name);
        let embd_norm = [
            values_or_missing(take("token_embd_norm.weight"), "token_embd_norm.weight")?,
            values_or_missing(take("token_embd_norm.bias"), "token_embd_norm.bias")?,
        ];
        let token_types = take("token_types.weight");
        let positions = take("position_embd.weight");
        let head = head_matrices.map(|(cls, output)| {
            Box::new(RankHead {
                cls: cls.map(|w| Dense { w, bias: take("cls.bias") }),
                output: output.map(|w| Dense { w, bias: take("cls.output.bias") }),
            })
        });
        let rope = (config.arch == EncoderArch::NomicBert).then_some(RopeConfig {
            mode: RopeMode::Neox,
            base: config.rope_base,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
            mscale: 1.0,
        });
        Ok(Self { config, token_embd, token_types, positions, embd_norm, layers, rope, head })
    }

    /// nomic-bert's RoPE; None for BERT (learned positions).
    pub(super) fn rope(&self) -> Option<&RopeConfig> {
        self.rope.as_ref()
    }

    /// Bytes the weights take: the matrices as the kernels store them, the rest as f32.
    pub fn weight_bytes(&self) -> usize {
        let values = |v: &[&Option<Vec<f32>>]| v.iter().map(|v| v.as_ref().map_or(0, |v| 4 * v.len())).sum::<usize>();
        let norms = |n: &[Vec<f32>; 2]| n.iter().map(|v| 4 * v.len()).sum::<usize>();
        let mut total = K::bytes(&self.token_embd) + values(&[&self.positions, &self.token_types]) + norms(&self.embd_norm);
        for l in &self.layers {
            total += match &l.qkv {
                Qkv::Fused { w, bias } => K::bytes(w) + values(&[bias]),
                Qkv::Split { w, bias } => w.iter().map(K::bytes).sum::<usize>() + values(&bias.each_ref()),
            };
            total += [&l.attn_output, &l.up, &l.down].into_iter().chain(&l.gate).map(K::bytes).sum::<usize>();
            total += values(&[&l.attn_output_bias, &l.up_bias, &l.down_bias]) + norms(&l.attn_norm) + norms(&l.output_norm);
        }
        if let Some(head) = &self.head {
            total += [&head.cls, &head.output].into_iter().flatten().map(|d| K::bytes(&d.w) + values(&[&d.bias])).sum::<usize>();
        }
        total
    }

    /// One pooled (not normalized) vector of `hidden` values per input; with rank pooling, the
    /// classifier head's outputs (`n_cls_out` values, the first the relevance logit; `hidden`
    /// where the file has no `cls.output`). Each input must hold 1 to `train_context` tokens of
    /// the vocabulary (the caller checks: `Embedder::embed`).
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Vec<Vec<f32>> {
        let (mut x, ranges) = self.input(inputs);
        for layer in &self.layers {
            x = self.layer(layer, x, &ranges);
        }
        self.output(&x, &ranges)
    }

    /// The packed, normalized embeddings of `inputs` (`[tokens][hidden]`) and each input's
    /// tokens: the layers' input.
    pub(super) fn input(&self, inputs: &[Vec<u32>]) -> (Vec<f32>, Vec<Range<usize>>) {
        let h = self.config.hidden;
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(inputs.len());
        let mut x = Vec::with_capacity(inputs.iter().map(Vec::len).sum::<usize>() * h);
        for tokens in inputs {
            let start = x.len() / h;
            for (p, &id) in tokens.iter().enumerate() {
                let mut row = K::row(&self.token_embd, id as usize);
                add_to(&mut row, self.token_types.as_deref().and_then(|t| t.get(..h)));
                add_to(&mut row, self.positions.as_deref().and_then(|t| t.get(p * h..(p + 1) * h)));
                x.extend_from_slice(&row);
            }
            ranges.push(start..start + tokens.len());
        }
        layer_norm(&mut x, &self.embd_norm, self.config.norm_eps);
        (x, ranges)
    }

    /// The pooled outputs of the last layer's rows `x`: the vectors, or the rank head's scores.
    pub(super) fn output(&self, x: &[f32], ranges: &[Range<usize>]) -> Vec<Vec<f32>> {
        let pooled: Vec<Vec<f32>> = ranges.iter().map(|r| self.pool(x, r.clone())).collect();
        match &self.head {
            Some(head) => self.classify(head, pooled),
            None => pooled,
        }
    }

    /// llama.cpp's rank head over the pooled `[CLS]` rows, all inputs in one product each.
    fn classify(&self, head: &RankHead<K::Matrix>, pooled: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        let n = pooled.len();
        let mut x: Vec<f32> = pooled.concat();
        if let Some(cls) = &head.cls {
            x = K::apply(&cls.w, &x);
            add_to(&mut x, cls.bias.as_deref());
            x.iter_mut().for_each(|v| *v = v.tanh());
        }
        if let Some(output) = &head.output {
            x = K::apply(&output.w, &x);
            add_to(&mut x, output.bias.as_deref());
        }
        let width = x.len() / n.max(1);
        x.chunks_exact(width.max(1)).map(<[f32]>::to_vec).collect()
    }

    fn layer(&self, layer: &Layer<K::Matrix>, x: Vec<f32>, ranges: &[Range<usize>]) -> Vec<f32> {
        let (h, eps) = (self.config.hidden, self.config.norm_eps);
        let [mut q, mut k, v] = match &layer.qkv {
            Qkv::Split { w, bias } => {
                let mut out = K::apply_each([&w[0], &w[1], &w[2]], &x);
                for (o, b) in out.iter_mut().zip(bias) {
                    add_to(o, b.as_deref());
                }
                out
            }
            Qkv::Fused { w, bias } => {
                let mut fused = K::apply(w, &x);
                add_to(&mut fused, bias.as_deref());
                let mut parts: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(x.len()));
                for row in fused.chunks_exact(3 * h) {
                    for (part, values) in parts.iter_mut().zip(row.chunks_exact(h)) {
                        part.extend_from_slice(values);
                    }
                }
                parts
            }
        };
        if let Some(rope_config) = &self.rope {
            for r in ranges {
                for (p, t) in r.clone().enumerate() {
                    for m in [&mut q, &mut k] {
                        let row = &mut m[t * h..(t + 1) * h];
                        let rotated = rope::rope(row, self.config.head_dim, p, rope_config);
                        row.copy_from_slice(&rotated);
                    }
                }
            }
        }
        let attended = self.attention(&q, &k, &v, ranges);
        let mut out = K::apply(&layer.attn_output, &attended);
        add_to(&mut out, layer.attn_output_bias.as_deref());
        add_to(&mut out, Some(&x));
        layer_norm(&mut out, &layer.attn_norm, eps);
        let ffn_in = out;
        let mut hidden = match &layer.gate {
            Some(gate) => {
                let [mut g, u] = K::apply_each([gate, &layer.up], &ffn_in);
                let f = self.config.ffn;
                for_row_chunks(&mut g, f, 1, |first, run| {
                    run.iter_mut().zip(&u[first * f..]).for_each(|(g, &u)| *g = GateActivation::Silu.apply(*g) * u);
                });
                g
            }
            None => {
                let mut u = K::apply(&layer.up, &ffn_in);
                add_to(&mut u, layer.up_bias.as_deref());
                for_row_chunks(&mut u, self.config.ffn, 1, |_, run| gelu_in_place(run));
                u
            }
        };
        let mut out = K::apply(&layer.down, &hidden);
        hidden.clear();
        add_to(&mut out, layer.down_bias.as_deref());
        add_to(&mut out, Some(&ffn_in));
        layer_norm(&mut out, &layer.output_norm, eps);
        out
    }

    /// Softmax attention of every token over every token of its own input, per head; the tokens'
    /// rows split over the pool.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], ranges: &[Range<usize>]) -> Vec<f32> {
        let (h, d, n_heads) = (self.config.hidden, self.config.head_dim, self.config.n_heads);
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0.0; q.len()];
        for_row_chunks(&mut out, h, 1, |first, rows| {
            let mut scores = Vec::new();
            for (i, o_row) in rows.chunks_exact_mut(h).enumerate() {
                let t = first + i;
                // The input the token belongs to (ranges are in order and cover every token).
                let Some(r) = ranges.get(ranges.partition_point(|r| r.end <= t)) else { continue };
                for head in 0..n_heads {
                    let col = head * d;
                    let qt = &q[t * h + col..][..d];
                    scores.clear();
                    scores.extend(r.clone().map(|s| scale * dot(qt, &k[s * h + col..][..d])));
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0;
                    scores.iter_mut().for_each(|s| {
                        *s = (*s - max).exp();
                        sum += *s;
                    });
                    let o = &mut o_row[col..][..d];
                    for (s, &w) in r.clone().zip(&scores) {
                        let w = w / sum;
                        o.iter_mut().zip(&v[s * h + col..][..d]).for_each(|(o, &v)| *o += w * v);
                    }
                }
            }
        });
        out
    }

    fn pool(&self, x: &[f32], r: Range<usize>) -> Vec<f32> {
        let h = self.config.hidden;
        let row = |t: usize| &x[t * h..(t + 1) * h];
        match self.config.pooling {
            Pooling::Cls | Pooling::Rank => row(r.start).to_vec(),
            Pooling::Last => row(r.end - 1).to_vec(),
            Pooling::Mean => {
                let n = r.len() as f32;
                let mut sum = vec![0.0f32; h];
                for t in r {
                    add_to(&mut sum, Some(row(t)));
                }
                sum.iter_mut().for_each(|s| *s /= n);
                sum
            }
        }
    }
}

/// Every layer's tensors out of `matrices` and `values`, the matrices of whichever backend.
pub(super) fn take_layers<M>(
    config: &EncoderConfig,
    matrices: &mut HashMap<String, M>,
    values: &mut HashMap<String, Vec<f32>>,
) -> Result<Vec<Layer<M>>, ModelError> {
    let mut matrix = |name: &str| matrices.remove(name).ok_or_else(|| bad_model(format!("tensor {name} never arrived")));
    let mut take = |name: &str| values.remove(name);
    let mut layers = Vec::with_capacity(config.n_layers);
    for l in 0..config.n_layers {
        let name = |s: &str| format!("blk.{l}.{s}");
        let qkv = match matrix(&name("attn_qkv.weight")) {
            Ok(w) => Qkv::Fused { w, bias: take(&name("attn_qkv.bias")) },
            Err(_) => Qkv::Split {
                w: [matrix(&name("attn_q.weight"))?, matrix(&name("attn_k.weight"))?, matrix(&name("attn_v.weight"))?],
                bias: ["attn_q", "attn_k", "attn_v"].map(|s| take(&name(&format!("{s}.bias")))),
            },
        };
        let gate = (config.arch == EncoderArch::NomicBert).then(|| matrix(&name("ffn_gate.weight"))).transpose()?;
        let mut norm = |stem: &str| -> Result<[Vec<f32>; 2], ModelError> {
            let (w, b) = (name(&format!("{stem}.weight")), name(&format!("{stem}.bias")));
            Ok([values_or_missing(take(&w), &w)?, values_or_missing(take(&b), &b)?])
        };
        let (attn_norm, output_norm) = (norm("attn_output_norm")?, norm("layer_output_norm")?);
        layers.push(Layer {
            qkv,
            attn_output: matrix(&name("attn_output.weight"))?,
            attn_output_bias: take(&name("attn_output.bias")),
            attn_norm,
            up: matrix(&name("ffn_up.weight"))?,
            up_bias: take(&name("ffn_up.bias")),
            gate,
            down: matrix(&name("ffn_down.weight"))?,
            down_bias: take(&name("ffn_down.bias")),
            output_norm,
        });
    }
    Ok(layers)
}

fn values_or_missing(v: Option<Vec<f32>>, name: &str) -> Result<Vec<f32>, ModelError> {
    v.ok_or_else(|| bad_model(format!("tensor {name} never arrived")))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `x += y` (whole rows of `x` when `y` is one row shorter than `x`: a bias or a table row).
fn add_to(x: &mut [f32], y: Option<&[f32]>) {
    if let Some(y) = y.filter(|y| !y.is_empty()) {
        for row in x.chunks_mut(y.len()) {
            row.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        }
    }
}

/// ggml's LayerNorm of each row (`ggml_norm`: mean and variance in f32), then `* w + b`.
fn layer_norm(x: &mut [f32], [w, b]: &[Vec<f32>; 2], eps: f32) {
    let h = w.len();
    for_row_chunks(x, h, 1, |_, rows| {
        for row in rows.chunks_exact_mut(h) {
            let mean = row.iter().sum::<f32>() / h as f32;
            row.iter_mut().for_each(|v| *v -= mean);
            let var = row.iter().map(|v| v * v).sum::<f32>() / h as f32;
            let scale = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
                *v = *v * scale * w + b;
            }
        }
    });
}
