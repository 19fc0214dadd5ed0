//! The shape of a layer's attention and how it scores keys.

/// Shape of one layer's attention and the layout of its KV cache: K and V are each
/// `[n_kv_heads][max_ctx][head_dim]` f32, position `p` of kv head `h` at `(h * max_ctx + p) * head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub max_ctx: usize,
}

impl AttentionShape {
    /// Values in one of the K or V caches.
    pub fn cache_len(&self) -> usize {
        self.n_kv_heads * self.max_ctx * self.head_dim
    }

    /// Width of a query or output row: `n_heads * head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// The kv head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.n_heads / self.n_kv_heads)
    }
}

/// How a layer turns `q . k` into the softmax's scores and which keys it sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    /// Multiplies `q . k` (1 / sqrt(head_dim) in most models).
    pub scale: f32,
    /// Gemma 2's soft cap: `score -> cap * tanh(score / cap)`; `None` leaves scores as they are.
    pub softcap: Option<f32>,
    /// Sliding-window attention: a query at position `p` sees keys at `p - window + 1..=p`
    /// (llama.cpp's standard SWA masks a key when `p - key >= window`); `None` sees all.
    pub window: Option<usize>,
}

impl Scores {
    /// Plain scaled scores over every earlier key.
    pub fn scaled(scale: f32) -> Self {
        Self { scale, softcap: None, window: None }
    }

    /// Whether the query at `query_pos` sees the key at `key_pos` (causal, and in the window).
    pub fn sees(&self, query_pos: usize, key_pos: usize) -> bool {
        key_pos <= query_pos && self.window.is_none_or(|w| query_pos - key_pos < w)
    }

    /// The score of a dot product `qk`, computed in f64.
    pub fn score(&self, qk: f64) -> f64 {
        let s = f64::from(self.scale) * qk;
        self.softcap.map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
    }
}
