//! The model shapes the kernels are benchmarked at, and the weight matrices of one layer (plus
//! the LM head) that the matvec and matmul kernels see at each.

use kestrel_gguf::GgmlType;

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

/// The dimensions of a Llama-family model that set the kernels' shapes.
#[derive(Clone, Copy, Debug)]
pub struct ModelShape {
    /// Short name shown in the table's first column.
    pub name: &'static str,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

/// The default model, SmolLM2-135M.
pub const DEFAULT_MODEL: ModelShape =
    ModelShape { name: "135M", hidden: 576, ffn: 1536, n_heads: 9, n_kv_heads: 3, head_dim: 64, vocab: 49152 };

/// A 1B-class model (Llama 3.2 1B).
pub const ONE_B: ModelShape = ModelShape { name: "1B", hidden: 2048, ffn: 8192, n_heads: 32, n_kv_heads: 8, head_dim: 64, vocab: 128_256 };

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

impl ModelShape {
    /// Width of the fused Q|K|V projection's output.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }

    /// Width of the attention output (all query heads).
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The matrices of one layer and the LM head, with the products the model computes with them.
    pub fn matrices(&self) -> [Matrix; 5] {
        let m = |name, rows, cols, product| Matrix { name, rows, cols, product };
        [
            m("qkv", self.qkv_width(), self.hidden, Product::Plain),
            m("o", self.hidden, self.q_width(), Product::Accumulate),
            m("gate/up", self.ffn, self.hidden, Product::Swiglu),
            m("down", self.hidden, self.ffn, Product::Accumulate),
            m("lm_head", self.vocab, self.hidden, Product::Plain),
        ]
    }
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
