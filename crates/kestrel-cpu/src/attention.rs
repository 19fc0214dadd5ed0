//! Causal grouped-query attention over a KV cache laid out `[kv_head][position][head_dim]`,
//! in f32 with the softmax's maximum subtracted; each (token, head) is one task of the pool.

use crate::dot::f32_dot;

/// A layer's attention: shapes, the scores' scale and soft cap, and the sliding window.
#[derive(Clone, Copy, Debug)]
pub struct Attention {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Positions per KV head in the caches.
    pub max_ctx: usize,
    pub scale: f32,
    /// `score -> cap * tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A query at `p` sees keys `p - window + 1..=p`.
    pub window: Option<usize>,
}

impl Attention {
    /// The attention of `q` (`[n][n_heads * head_dim]`, token `t` at position `pos + t`) over
    /// the caches, which hold positions `0..pos + n`.
    ///
    /// Panics on inconsistent shapes (bugs of the caller).
    pub fn apply(&self, q: &[f32], k_cache: &[f32], v_cache: &[f32], pos: usize) -> Vec<f32> {
        let hd = self.head_dim;
        assert!(self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads), "attention: head counts");
        assert!(k_cache.len() == self.n_kv_heads * self.max_ctx * hd && v_cache.len() == k_cache.len(), "attention: cache size");
        let mut out = vec![0f32; q.len()];
        let task = |i: usize, out: &mut [f32]| {
            let (t, h) = (i / self.n_heads, i % self.n_heads);
            let query_pos = pos + t;
            let first = self.window.map_or(0, |w| (query_pos + 1).saturating_sub(w));
            let kv_head = h / (self.n_heads / self.n_kv_heads);
            let row = |p: usize| (kv_head * self.max_ctx + p) * hd;
            let qh = &q[i * hd..][..hd];
            let mut weights: Vec<f32> = (first..=query_pos)
                .map(|p| {
                    let s = self.scale * f32_dot(qh, &k_cache[row(p)..][..hd]);
                    self.softcap.map_or(s, |cap| cap * (s / cap).tanh())
                })
                .collect();
            let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for w in &mut weights {
                *w = (*w - max).exp();
                total += *w;
            }
            out.fill(0.0);
            for (p, w) in (first..=query_pos).zip(&weights) {
                for (o, v) in out.iter_mut().zip(&v_cache[row(p)..][..hd]) {
                    *o += w * v;
                }
            }
            out.iter_mut().for_each(|o| *o /= total);
        };
        crate::parallel::for_each_chunk(&mut out, hd, task);
        out
    }
}
