//! Causal grouped-query attention over a KV cache, by the textbook softmax (f64 accumulation).

use crate::params::{AttentionShape, Scores};

/// Attention of the queries `q` (`[n_tokens][n_heads * head_dim]`, token `t` at position
/// `pos + t`) over the caches: query `t` attends to the positions `0..=pos + t` that `scores`
/// lets it see. Returns `[n_tokens][n_heads * head_dim]`.
///
/// Panics on inconsistent shapes or a position beyond the cache (bugs of the caller).
pub fn attention(shape: &AttentionShape, q: &[f32], k_cache: &[f32], v_cache: &[f32], pos: usize, scores: &Scores) -> Vec<f32> {
    let AttentionShape { n_heads, n_kv_heads, head_dim: hd, max_ctx } = *shape;
    assert!(n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads), "attention: {n_heads} heads over {n_kv_heads} kv heads");
    assert!(q.len().is_multiple_of(shape.q_width()), "attention: q is not rows of n_heads * head_dim");
    assert!(k_cache.len() == shape.cache_len() && v_cache.len() == shape.cache_len(), "attention: cache size");
    let n_tokens = q.len() / shape.q_width();
    assert!(pos + n_tokens <= max_ctx, "attention: positions up to {} beyond max_ctx {max_ctx}", pos + n_tokens);
    let mut out = vec![0f32; q.len()];
    for t in 0..n_tokens {
        let query_pos = pos + t;
        let keys: Vec<usize> = (0..=query_pos).filter(|&p| scores.sees(query_pos, p)).collect();
        for h in 0..n_heads {
            let qh = &q[(t * n_heads + h) * hd..][..hd];
            let cache_row = |p: usize| (shape.kv_head(h) * max_ctx + p) * hd;
            let key_scores: Vec<f64> = keys
                .iter()
                .map(|&p| {
                    let k = &k_cache[cache_row(p)..][..hd];
                    scores.score(qh.iter().zip(k).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>())
                })
                .collect();
            let max = key_scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = key_scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (d, o) in out[(t * n_heads + h) * hd..][..hd].iter_mut().enumerate() {
                let acc: f64 = weights.iter().zip(&keys).map(|(w, &p)| w * f64::from(v_cache[cache_row(p) + d])).sum();
                *o = (acc / total) as f32;
            }
        }
    }
    out
}

/// An encoder's bidirectional attention over packed inputs, by the textbook softmax (f64): the
/// tokens of `q`, `k` and `v` (`[n_tokens][n_heads * head_dim]` each) are inputs of `lengths`
/// tokens, in order, and each query attends to every key of its own input. Scores are
/// `q·k * scale`. Returns `[n_tokens][n_heads * head_dim]`.
///
/// Panics on inconsistent shapes (bugs of the caller).
pub fn bidirectional(q: &[f32], k: &[f32], v: &[f32], lengths: &[usize], n_heads: usize, head_dim: usize, scale: f32) -> Vec<f32> {
    let width = n_heads * head_dim;
    let n_tokens: usize = lengths.iter().sum();
    assert!(q.len() == n_tokens * width && k.len() == q.len() && v.len() == q.len(), "bidirectional: shapes");
    let mut out = vec![0f32; q.len()];
    let mut start = 0;
    for &n in lengths {
        for t in start..start + n {
            for h in 0..n_heads {
                let at =
                    |m: &[f32], s: usize| -> Vec<f64> { m[s * width + h * head_dim..][..head_dim].iter().map(|&x| f64::from(x)).collect() };
                let qt = at(q, t);
                let scores: Vec<f64> =
                    (start..start + n).map(|s| at(k, s).iter().zip(&qt).map(|(a, b)| a * b).sum::<f64>() * f64::from(scale)).collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for d in 0..head_dim {
                    let o: f64 = (start..start + n).zip(&weights).map(|(s, w)| w * f64::from(v[s * width + h * head_dim + d])).sum();
                    out[t * width + h * head_dim + d] = (o / sum) as f32;
                }
            }
        }
        start += n;
    }
    out
}
