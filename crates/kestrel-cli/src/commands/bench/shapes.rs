//! The weight matrices of one layer (plus the LM head) that the matvec and matmul kernels see at
//! each model shape they are benchmarked at. The shapes themselves are the synthetic models'
//! (`kestrel_model::synthetic`), the one definition of each model size.

use kestrel_gguf::GgmlType;
use kestrel_model::synthetic::{SyntheticShape, LLAMA_1B, SMOLLM2_135M};

/// The weight types the GPU kernels read, in the order the table lists them.
pub const WEIGHT_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_1,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::F32,
];

/// Tokens of a prefill chunk (matmul, prefill attention, the prefill rows of the small kernels).
pub const PREFILL_TOKENS: u32 = 128;

/// Sequences of a batched decode step (`kestrel serve`'s default slots): their products run as the
/// batched matvec, timed beside the tiled matmul over as many tokens, the alternative it beat.
pub const DECODE_BATCH: u32 = 8;

/// KV lengths decode attention is timed at.
pub const DECODE_KV_LENS: [u32; 2] = [512, 2048];

/// The model shapes the kernels are benchmarked at: the default model's and a 1B-class one's.
pub const BENCH_SHAPES: [SyntheticShape; 2] = [SMOLLM2_135M, LLAMA_1B];

/// What the model does with a matrix product, which picks the kernel variant it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// `y = W x`.
    Plain,
    /// `y += W x`: the residual add of the O and down projections.
    Accumulate,
    /// `silu(Wg x) * (Wu x)` with two matrices of this shape (gate and up).
    Swiglu,
}

/// One weight matrix of the model: `rows` x `cols` (output features x input features).
#[derive(Clone, Copy, Debug)]
pub struct Matrix {
    pub name: &'static str,
    pub rows: usize,
    pub cols: usize,
    pub product: Product,
}

impl Matrix {
    /// Multiply-adds of the product over `tokens` tokens (both matrices for SwiGLU).
    pub fn macs(&self, tokens: u32) -> u64 {
        let matrices = if self.product == Product::Swiglu { 2 } else { 1 };
        matrices * (self.rows * self.cols) as u64 * u64::from(tokens)
    }
}

/// The matrices of one layer of `model` and its LM head, with the products the model computes
/// with them.
pub fn matrices(model: &SyntheticShape) -> [Matrix; 5] {
    let m = |name, rows, cols, product| Matrix { name, rows, cols, product };
    [
        m("qkv", model.qkv_width(), model.hidden, Product::Plain),
        m("o", model.hidden, model.q_width(), Product::Accumulate),
        m("gate/up", model.ffn, model.hidden, Product::Swiglu),
        m("down", model.hidden, model.ffn, Product::Accumulate),
        m("lm_head", model.vocab, model.hidden, Product::Plain),
    ]
}

/// Whether rows of `cols` weights are whole blocks of `ty`. The K-quants need multiples of 256,
/// which the 135M model's hidden size (576) is not: llama.cpp stores such tensors in another type,
/// so the benchmark has no case for them.
pub fn whole_blocks(ty: GgmlType, cols: usize) -> bool {
    ty.row_bytes(cols as u64).is_some()
}

/// Bytes of a `rows` x `cols` matrix of `ty` in GGUF (the GPU layout only realigns them, so the
/// buffer is this size rounded up to whole words); `None` if the row length is not a whole
/// number of blocks. Known before quantizing, so a matrix too large to bind is skipped cheaply.
pub fn matrix_bytes(ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
    ty.row_bytes(cols as u64)?.checked_mul(rows as u64)
}
