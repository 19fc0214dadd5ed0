//! The shape of a layer's attention and how it scores keys.

/// How the KV cache stores its values: f16 halves its memory and the attention's reads (llama.cpp's
/// default too); f32 keeps every bit of the projections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    #[default]
    F16,
    F32,
}

impl KvType {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            Self::F16 => 2,
            Self::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::F32 => "f32",
        }
    }

    /// Parses a name `name()` gives.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::F16, Self::F32].into_iter().find(|t| t.name() == name)
    }

    /// The value a cache of this type holds for `x` (f16: rounded to nearest even).
    pub fn stored(self, x: f32) -> f32 {
        match self {
            Self::F16 => half::f16::from_f32(x).to_f32(),
            Self::F32 => x,
        }
    }

    /// `values` in the cache's bytes (f16: rounded to nearest even, two per u32 word with the
    /// first in the low half, i.e. consecutive little-endian halves).
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            Self::F16 => values.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            Self::F32 => bytemuck::cast_slice(values).to_vec(),
        }
    }

    /// The values in the cache's `bytes` (`encode`'s layout).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Self::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Self::F32 => bytemuck::pod_collect_to_vec(bytes),
        }
    }
}

/// Shape of one layer's attention and the layout of its KV cache: K and V are each
/// `[n_kv_heads][max_ctx][head_dim]` values, position `p` of kv head `h` at `(h * max_ctx + p) * head_dim`.
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
