//! The model graph on the CPU, over a set of kernels: the f32 reference (`reference.rs`, which
//! the tests check the GPU against) and the fast quantized kernels of `kestrel-cpu`
//! (`cpu_backend.rs`, the CPU backend) run this one pass, so the two cannot drift apart.

use std::collections::HashMap;

use kestrel_cpu::KvRows;
use kestrel_gguf::GgmlType;
use kestrel_ops::params::{AttentionShape, KvType, RopeConfig, Scores};
use kestrel_ops::reference::{norm, rope};

use crate::config::ModelConfig;
use crate::error::{bad_model, ModelError};
use crate::tensors::Role;

/// The products and attention a CPU pass runs on.
pub trait CpuKernels {
    type Matrix;
    /// A `rows` x `cols` matrix from GGUF bytes of type `ty`.
    fn matrix(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Self::Matrix, ModelError>;
    /// `y = x·Wᵀ` for the rows of `x`.
    fn apply(m: &Self::Matrix, x: &[f32]) -> Vec<f32>;
    /// `apply` of each matrix to the same `x`.
    fn apply_each<const N: usize>(ms: [&Self::Matrix; N], x: &[f32]) -> [Vec<f32>; N] {
        ms.map(|m| Self::apply(m, x))
    }
    /// Row `r` as f32 (the embedding gather).
    fn row(m: &Self::Matrix, r: usize) -> Vec<f32>;
    /// The rows before `at` and the rows from it.
    fn split_rows(m: Self::Matrix, at: usize) -> Result<(Self::Matrix, Self::Matrix), ModelError>;
    /// Bytes the matrix takes.
    fn bytes(m: &Self::Matrix) -> usize;
    /// Whether an f16 KV cache keeps f16 bits (else f32 values rounded to f16).
    const F16_BITS: bool;
    /// Causal attention of `q` (`[n][n_heads * head_dim]`, token `t` at `pos + t`) over a layer's
    /// caches.
    fn attention(shape: &AttentionShape, q: &[f32], cache: KvRows<'_>, pos: usize, scores: &Scores) -> Vec<f32>;
}

struct Layer<M> {
    attn_norm: Vec<f32>,
    q: M,
    k: M,
    v: M,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of Q and K (Qwen3).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// The layer's RoPE (none: SmolLM3's every fourth layer; Gemma's sliding layers have their
    /// own base) and how it scores keys (scale, soft cap, window).
    rope: Option<RopeConfig>,
    scores: Scores,
    /// Gemma's norms of the attention and FFN outputs.
    post_norms: Option<[Vec<f32>; 2]>,
    attn_output: M,
    ffn_norm: Vec<f32>,
    gate: M,
    up: M,
    down: M,
}

/// One layer's keys and values, `[kv_head][position][head_dim]` each. Allocated zeroed, so the
/// system commits a page only when a position in it is first written, and fallibly: no room is
/// `out_of_memory`, not an abort.
enum LayerKv {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// f16 bits: half the memory and half the bytes attention reads.
    F16 {
        k: Vec<u16>,
        v: Vec<u16>,
    },
}

impl LayerKv {
    fn new(len: usize, f16_bits: bool) -> Result<Self, ModelError> {
        let what = || format!("a layer's KV cache ({len} values)");
        Ok(if f16_bits {
            Self::F16 { k: kestrel_cpu::zeroed(len, &what)?, v: kestrel_cpu::zeroed(len, &what)? }
        } else {
            Self::F32 { k: kestrel_cpu::zeroed(len, &what)?, v: kestrel_cpu::zeroed(len, &what)? }
        })
    }

    /// Stores a key and a value row at offset `at`, rounded as the cache type `kv` rounds them.
    fn write(&mut self, at: usize, key: &[f32], value: &[f32], kv: KvType) {
        match self {
            Self::F32 { k, v } => {
                for (cache, row) in [(k, key), (v, value)] {
                    cache[at..][..row.len()].iter_mut().zip(row).for_each(|(c, &x)| *c = kv.stored(x));
                }
            }
            Self::F16 { k, v } => {
                for (cache, row) in [(k, key), (v, value)] {
                    cache[at..][..row.len()].iter_mut().zip(row).for_each(|(c, &x)| *c = half::f16::from_f32(x).to_bits());
                }
            }
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Self::F32 { k, v } => KvRows::F32 { k, v },
            Self::F16 { k, v } => KvRows::F16 { k, v },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F32 { k, v } => 4 * (k.len() + v.len()),
            Self::F16 { k, v } => 2 * (k.len() + v.len()),
        }
    }
}

/// One sequence's caches, a layer each.
struct KvCache {
    layers: Vec<LayerKv>,
}

impl KvCache {
    fn new(layers: usize, len: usize, f16_bits: bool) -> Result<Self, ModelError> {
        Ok(Self { layers: (0..layers).map(|_| LayerKv::new(len, f16_bits)).collect::<Result<_, _>>()? })
    }
}

/// One sequence's part of a batched step (`CpuForward::run_batch`).
#[derive(Clone, Copy, Debug)]
pub struct SequenceStep<'a> {
    /// The KV cache the sequence uses (`CpuForward::set_slots`).
    pub slot: usize,
    /// Tokens already in that cache: `tokens` run at positions `pos..`.
    pub pos: usize,
    pub tokens: &'a [u32],
    /// How many of its last tokens' logits to return, `[row][vocab]` in order: 0 for a prefill
    /// chunk before the last (it needs only its KV rows), 1 for a step that samples, and every
    /// row of a speculative verification (each drafted token is checked against the logits of
    /// the row before it).
    pub logits: usize,
}

pub struct CpuForward<K: CpuKernels> {
    pub config: ModelConfig,
    embedding: K::Matrix,
    output_norm: Vec<f32>,
    /// None when tied to the embedding.
    output: Option<K::Matrix>,
    layers: Vec<Layer<K::Matrix>>,
    /// One KV cache per slot: sequences batched together each attend to their own.
    caches: Vec<KvCache>,
    shape: AttentionShape,
    /// The values the caches hold: the GPU cache's type, so that both passes attend to the same
    /// keys and values.
    kv: KvType,
    /// Tokens already in slot 0's cache (`forward` and `run` append to it).
    pub pos: usize,
}

/// A file's tensors sorted for `CpuForward::from_tensors`: matrices for the kernels, vectors as f32.
pub struct CpuTensors<M> {
    pub matrices: HashMap<Role, M>,
    pub vectors: HashMap<Role, Vec<f32>>,
}

impl<M> Default for CpuTensors<M> {
    fn default() -> Self {
        Self { matrices: HashMap::new(), vectors: HashMap::new() }
    }
}

impl<M> CpuTensors<M> {
    /// Adds the tensor of `role`, `rows` x `cols` of type `ty` (vectors have one row).
    pub fn add<K: CpuKernels<Matrix = M>>(
        &mut self,
        role: Role,
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<(), ModelError> {
        if rows == 1 {
            let mut values = vec![0.0; cols];
            kestrel_gguf::dequantize(ty, bytes, &mut values)?;
            self.vectors.insert(role, values);
        } else {
            self.matrices.insert(role, K::matrix(ty, bytes, rows, cols)?);
        }
        Ok(())
    }
}

impl<K: CpuKernels> CpuForward<K> {
    /// The model of `config` from its tensors, with a KV cache of `max_ctx` positions of `kv`
    /// values.
    pub fn from_tensors(config: ModelConfig, tensors: CpuTensors<K::Matrix>, max_ctx: usize, kv: KvType) -> Result<Self, ModelError> {
        let CpuTensors { mut matrices, mut vectors } = tensors;
        split_fused::<K>(&config, &mut matrices, &mut vectors)?;
        let missing = |role: Role| bad_model(format!("missing {role:?}"));
        let mut matrix = |role: Role| matrices.remove(&role).ok_or_else(|| missing(role));
        let mut vector = |role: Role| vectors.remove(&role).ok_or_else(|| missing(role));
        let shape = AttentionShape { n_heads: config.n_heads, n_kv_heads: config.n_kv_heads, head_dim: config.head_dim, max_ctx };
        let model_rope = config.rope_config(crate::tensors::rope_factors_role(&config, max_ctx).map(&mut vector).transpose()?)?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let (biased, normed) = (config.qkv_bias, config.qk_norm);
            layers.push(Layer {
                attn_norm: vector(Role::AttnNorm(l))?,
                q: matrix(Role::Q(l))?,
                k: matrix(Role::K(l))?,
                v: matrix(Role::V(l))?,
                q_bias: if biased { Some(vector(Role::QBias(l))?) } else { None },
                k_bias: if biased { Some(vector(Role::KBias(l))?) } else { None },
                v_bias: if biased { Some(vector(Role::VBias(l))?) } else { None },
                q_norm: if normed { Some(vector(Role::QNorm(l))?) } else { None },
                k_norm: if normed { Some(vector(Role::KNorm(l))?) } else { None },
                rope: config.layer_rope(l, &model_rope),
                scores: config.layer_scores(l),
                post_norms: if config.post_norms { Some([vector(Role::AttnPostNorm(l))?, vector(Role::FfnPostNorm(l))?]) } else { None },
                attn_output: matrix(Role::AttnOutput(l))?,
                ffn_norm: vector(Role::FfnNorm(l))?,
                gate: matrix(Role::Gate(l))?,
                up: matrix(Role::Up(l))?,
                down: matrix(Role::Down(l))?,
            });
        }
        Ok(Self {
            embedding: matrix(Role::TokenEmbedding)?,
            output_norm: vector(Role::OutputNorm)?,
            output: if config.tied_embeddings { None } else { Some(matrix(Role::Output)?) },
            caches: vec![Self::empty_cache(config.n_layers, shape, kv)?],
            config,
            layers,
            shape,
            kv,
            pos: 0,
        })
    }

    /// KV cache length in tokens.
    pub fn max_ctx(&self) -> usize {
        self.shape.max_ctx
    }

    /// Bytes of the weight matrices.
    pub fn matrix_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| [&l.q, &l.k, &l.v, &l.attn_output, &l.gate, &l.up, &l.down].into_iter().map(K::bytes).sum::<usize>())
            .sum();
        layers + K::bytes(&self.embedding) + self.output.as_ref().map_or(0, K::bytes)
    }

    /// Bytes of the matrices a one-token step reads: every layer's and the LM head (one
    /// row of an untied embedding table is noise).
    pub fn matrix_bytes_per_token(&self) -> usize {
        self.matrix_bytes() - self.output.as_ref().map_or(0, |_| K::bytes(&self.embedding))
    }

    /// Bytes of the KV caches, every slot's (what they may grow to: pages never written are
    /// not committed).
    pub fn cache_bytes(&self) -> usize {
        self.caches.iter().flat_map(|c| &c.layers).map(LayerKv::bytes).sum()
    }

    /// Bytes of every buffer the model holds: its matrices, norm and bias vectors and KV caches
    /// (the RoPE tables, a few hundred bytes a layer, aside), which the will-it-fit estimate
    /// predicts.
    pub fn buffer_bytes(&self) -> usize {
        let floats = |v: &[f32]| 4 * v.len();
        let optional = |v: &Option<Vec<f32>>| v.as_deref().map_or(0, floats);
        let vectors: usize = self
            .layers
            .iter()
            .map(|l| {
                let post_norms = l.post_norms.as_ref().map_or(0, |[a, b]| floats(a) + floats(b));
                floats(&l.attn_norm)
                    + floats(&l.ffn_norm)
                    + post_norms
                    + [&l.q_bias, &l.k_bias, &l.v_bias, &l.q_norm, &l.k_norm].into_iter().map(optional).sum::<usize>()
            })
            .sum();
        self.matrix_bytes() + vectors + floats(&self.output_norm) + self.cache_bytes()
    }

    /// KV caches, one per sequence a batched step may hold.
    pub fn slots(&self) -> usize {
        self.caches.len()
    }

    /// Keeps `n` KV caches (at least 1): slots added are empty, slots removed are freed. No room
    /// for the caches added is `out_of_memory`, with the slots as they were.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        let (layers, shape, kv) = (self.config.n_layers, self.shape, self.kv);
        let n = n.max(1);
        self.caches.truncate(n);
        let added = (self.caches.len()..n).map(|_| Self::empty_cache(layers, shape, kv)).collect::<Result<Vec<_>, _>>()?;
        self.caches.extend(added);
        Ok(())
    }

    /// A sequence's empty KV cache: f16 values kept as f16 bits where the kernels read them so
    /// (`CpuKernels::F16_BITS`), else widened to f32. A layer's length is counted without
    /// overflow: a context no memory holds (the page may ask for a billion positions, whose
    /// product wraps a 32-bit size into a small one) is `out_of_memory` too.
    fn empty_cache(layers: usize, shape: AttentionShape, kv: KvType) -> Result<KvCache, ModelError> {
        let f16_bits = K::F16_BITS && kv == KvType::F16;
        let len = shape.n_kv_heads.checked_mul(shape.max_ctx).and_then(|n| n.checked_mul(shape.head_dim));
        let len = len.ok_or_else(|| {
            let value_bytes: u64 = if f16_bits { 2 } else { 4 };
            let bytes = [shape.n_kv_heads, shape.max_ctx, shape.head_dim].into_iter().fold(value_bytes, |a, b| a.saturating_mul(b as u64));
            ModelError::OutOfMemory { what: format!("a layer's KV cache of {} positions", shape.max_ctx), bytes }
        })?;
        KvCache::new(layers, len, f16_bits)
    }

    /// Runs `tokens` at positions `pos..`, appends them to the caches, and returns the logits
    /// of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.run(tokens, true).map(Option::unwrap_or_default)
    }

    /// `forward`, with the LM head only when `logits` (a prefill chunk before the last needs
    /// only its KV rows).
    pub fn run(&mut self, tokens: &[u32], logits: bool) -> Result<Option<Vec<f32>>, ModelError> {
        let step = SequenceStep { slot: 0, pos: self.pos, tokens, logits: usize::from(logits) };
        let out = self.run_batch(&[step])?.pop().flatten();
        self.pos += tokens.len();
        Ok(out)
    }

    /// Runs several sequences' tokens as one pass: every product reads its weights once for
    /// all of their rows, and each sequence's rows attend to its own slot's cache. Returns the
    /// logits of each step's last `logits` rows (`[row][vocab]`) where it asked for them. Every
    /// row is computed on its own, so a sequence's logits do not depend on what it was batched
    /// with.
    pub fn run_batch(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        if let Some(bad) = steps.iter().find(|s| s.logits > s.tokens.len()) {
            return Err(ModelError::InvalidOption {
                name: "step",
                reason: format!("logits of {} rows of a {}-token step", bad.logits, bad.tokens.len()),
            });
        }
        let (x, starts) = self.layers_pass(steps)?;
        let c = &self.config;
        let hidden = c.hidden;
        // The LM head once for the asked-for rows of every step.
        let wanted: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].logits > 0).collect();
        let mut out = vec![None; steps.len()];
        if wanted.is_empty() {
            return Ok(out);
        }
        let rows: Vec<f32> = wanted
            .iter()
            .flat_map(|&i| {
                let end = starts[i] + steps[i].tokens.len();
                &x[(end - steps[i].logits) * hidden..end * hidden]
            })
            .copied()
            .collect();
        let normed = norm::rmsnorm(&rows, &self.output_norm, c.rms_eps);
        let mut logits = K::apply(self.output.as_ref().unwrap_or(&self.embedding), &normed);
        if let Some(cap) = c.final_softcap {
            logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        let per_row = logits.len() / wanted.iter().map(|&i| steps[i].logits).sum::<usize>();
        let mut rest = logits.as_slice();
        for &i in &wanted {
            let (mine, others) = rest.split_at(steps[i].logits * per_row);
            out[i] = Some(mine.to_vec());
            rest = others;
        }
        Ok(out)
    }

    /// Runs the steps as `run_batch` does (appending to their slots' caches) and returns every
    /// token's final hidden state after the output norm, `[token][hidden]` in step order: what
    /// llama.cpp's embedding contexts pool (`result_norm`, before the LM head).
    pub fn normed_hidden(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<f32>, ModelError> {
        let (x, _) = self.layers_pass(steps)?;
        Ok(norm::rmsnorm(&x, &self.output_norm, self.config.rms_eps))
    }

    /// The embedding and every layer over the steps' tokens: the residual stream of every row
    /// (`[token][hidden]`) and each step's first row in it.
    fn layers_pass(&mut self, steps: &[SequenceStep<'_>]) -> Result<(Vec<f32>, Vec<usize>), ModelError> {
        self.check_steps(steps)?;
        let c = &self.config;
        let (hd, q_width, kv_width) = (c.head_dim, c.q_width(), c.kv_width());
        // Row offsets of each step's tokens in the batch.
        let starts: Vec<usize> = steps.iter().scan(0, |row, s| Some(std::mem::replace(row, *row + s.tokens.len()))).collect();
        let mut x: Vec<f32> = steps.iter().flat_map(|s| s.tokens).flat_map(|&t| K::row(&self.embedding, t as usize)).collect();
        if c.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embedding_scale);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let h = norm::rmsnorm(&x, &layer.attn_norm, c.rms_eps);
            let [q, k, v] = K::apply_each([&layer.q, &layer.k, &layer.v], &h);
            let q = add_bias(q, layer.q_bias.as_deref());
            let k = add_bias(k, layer.k_bias.as_deref());
            let v = add_bias(v, layer.v_bias.as_deref());
            // Each head is a row of head_dim values for the per-head norms.
            let q = match &layer.q_norm {
                Some(w) => norm::rmsnorm(&q, w, c.rms_eps),
                None => q,
            };
            let k = match &layer.k_norm {
                Some(w) => norm::rmsnorm(&k, w, c.rms_eps),
                None => k,
            };
            let rotate = |x: &[f32], p: usize| layer.rope.as_ref().map_or_else(|| x.to_vec(), |config| rope::rope(x, hd, p, config));
            let mut attn = Vec::with_capacity(q.len());
            for (step, &first) in steps.iter().zip(&starts) {
                let cache = &mut self.caches[step.slot].layers[l];
                let mut q_roped = Vec::with_capacity(step.tokens.len() * q_width);
                for t in 0..step.tokens.len() {
                    let (row, p) = (first + t, step.pos + t);
                    q_roped.extend(rotate(&q[row * q_width..][..q_width], p));
                    let k_roped = rotate(&k[row * kv_width..][..kv_width], p);
                    for kvh in 0..c.n_kv_heads {
                        let at = (kvh * self.shape.max_ctx + p) * hd;
                        cache.write(at, &k_roped[kvh * hd..][..hd], &v[row * kv_width + kvh * hd..][..hd], self.kv);
                    }
                }
                attn.extend(K::attention(&self.shape, &q_roped, cache.rows(), step.pos, &layer.scores));
            }
            let o = K::apply(&layer.attn_output, &attn);
            let post_norm = |y: Vec<f32>, i: usize| match &layer.post_norms {
                Some(weights) => norm::rmsnorm(&y, &weights[i], c.rms_eps),
                None => y,
            };
            x.iter_mut().zip(&post_norm(o, 0)).for_each(|(x, o)| *x += o);
            let h = norm::rmsnorm(&x, &layer.ffn_norm, c.rms_eps);
            let [g, u] = K::apply_each([&layer.gate, &layer.up], &h);
            let act: Vec<f32> = g.into_iter().zip(u).map(|(g, u)| c.gate_activation.apply(g) * u).collect();
            let d = K::apply(&layer.down, &act);
            x.iter_mut().zip(&post_norm(d, 1)).for_each(|(x, d)| *x += d);
        }
        Ok((x, starts))
    }

    /// Every step names its own existing slot, has tokens of the vocabulary and fits the context.
    fn check_steps(&self, steps: &[SequenceStep<'_>]) -> Result<(), ModelError> {
        let mut used = vec![false; self.caches.len()];
        for step in steps {
            let n = step.tokens.len();
            if n == 0 || step.pos + n > self.shape.max_ctx {
                return Err(ModelError::ContextOverflow { needed: step.pos + n, context: self.shape.max_ctx });
            }
            match used.get_mut(step.slot) {
                Some(u) if !*u => *u = true,
                _ => {
                    return Err(ModelError::InvalidOption {
                        name: "slot",
                        reason: format!("{} is absent or used twice in a step", step.slot),
                    })
                }
            }
            if let Some(&bad) = step.tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
                return Err(ModelError::InvalidOption { name: "tokens", reason: format!("id {bad} >= vocab {}", self.config.vocab) });
            }
        }
        Ok(())
    }
}

/// Splits the file's fused tensors into the parts the forward pass reads: Phi-3's Q|K|V matrix
/// and bias into Q, K and V, its gate|up matrix into gate and up (row blocks of row-major
/// matrices).
fn split_fused<K: CpuKernels>(
    c: &ModelConfig,
    matrices: &mut HashMap<Role, K::Matrix>,
    vectors: &mut HashMap<Role, Vec<f32>>,
) -> Result<(), ModelError> {
    let (q, kv) = (c.q_width(), c.kv_width());
    for l in 0..c.n_layers {
        if let Some(qkv) = matrices.remove(&Role::Qkv(l)) {
            let (q_part, kv_parts) = K::split_rows(qkv, q)?;
            let (k_part, v_part) = K::split_rows(kv_parts, kv)?;
            matrices.extend([(Role::Q(l), q_part), (Role::K(l), k_part), (Role::V(l), v_part)]);
        }
        if let Some(bias) = vectors.remove(&Role::QkvBias(l)) {
            let (q_part, rest) = bias.split_at(q.min(bias.len()));
            let (k_part, v_part) = rest.split_at(kv.min(rest.len()));
            vectors.extend([(Role::QBias(l), q_part.to_vec()), (Role::KBias(l), k_part.to_vec()), (Role::VBias(l), v_part.to_vec())]);
        }
        if let Some(gate_up) = matrices.remove(&Role::GateUp(l)) {
            let (gate, up) = K::split_rows(gate_up, c.ffn)?;
            matrices.extend([(Role::Gate(l), gate), (Role::Up(l), up)]);
        }
    }
    Ok(())
}

fn add_bias(mut y: Vec<f32>, bias: Option<&[f32]>) -> Vec<f32> {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
        }
    }
    y
}
