//! Causal grouped-query attention over a KV cache laid out `[kv_head][position][head_dim]`, in
//! f32 with the softmax's maximum subtracted.
//!
//! A task takes the query rows of one KV head (its query heads for up to `TASK_TOKENS` tokens)
//! over one span of keys, so each key and value row is read once for all of those rows: scores
//! in register tiles of `ROW_TILE` rows by `KEY_TILE` keys, the value products in tiles of
//! `ROW_TILE` rows by 16 dimensions, the softmax's exponentials 8 at a time. A task returns its rows' maximum score, sum of weights and
//! unnormalized output, which `merge` combines across spans of `SPAN` keys: a decode step (one
//! token, a few KV heads) at a long context is then several tasks for the threads. The spans are
//! fixed runs of positions, so a token's output has the same bits whether it runs in a prefill
//! chunk or as a decode step.

//!
//! The tiles are written once over 8 f32 lanes (`lanes::Lanes`), which each instruction set
//! implements (`arch::x86::lanes`, `arch::wasm::lanes`, and plain arrays).

pub(crate) mod lanes;

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use crate::arch::x86;
use crate::parallel::for_each_chunk;
use lanes::{CacheValue, Lanes, LANES};

/// One layer's keys and values, `[kv_head][position][head_dim]` each: f32, or f16 bits (half the
/// memory and half the bytes a step reads; the values an f16 cache holds in either case).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    F16 { k: &'a [u16], v: &'a [u16] },
}

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

/// Tokens a task takes the query rows of: a KV head's rows for 4 tokens are a multiple of
/// `ROW_TILE` whatever the group size.
const TASK_TOKENS: usize = 4;
/// Query rows a score or value tile computes.
const ROW_TILE: usize = 4;
/// Keys a score tile computes: 4 x 3 accumulators of 8 lanes fit AVX2's 16 registers with the
/// rows' and keys' loads.
const KEY_TILE: usize = 3;
/// Value dimensions a value tile computes (two lane groups).
const DIM_TILE: usize = 2 * LANES;
/// Keys a span holds: spans start at multiples of it.
const SPAN: usize = 512;

/// A row's partial result: its maximum score and sum of weights, then its output.
const HEADER: usize = 2;

impl Attention {
    /// The attention of `q` (`[n][n_heads * head_dim]`, token `t` at position `pos + t`) over
    /// the caches, which hold positions `0..pos + n`.
    ///
    /// Panics on inconsistent shapes (bugs of the caller).
    pub fn apply(&self, q: &[f32], cache: KvRows<'_>, pos: usize) -> Vec<f32> {
        match cache {
            KvRows::F32 { k, v } => self.apply_to(q, k, v, pos),
            KvRows::F16 { k, v } => self.apply_to(q, k, v, pos),
        }
    }

    fn apply_to<E: CacheValue>(&self, q: &[f32], k_cache: &[E], v_cache: &[E], pos: usize) -> Vec<f32> {
        let hd = self.head_dim;
        assert!(self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads), "attention: head counts");
        assert!(k_cache.len() == self.n_kv_heads * self.max_ctx * hd && v_cache.len() == k_cache.len(), "attention: cache size");
        let width = self.n_heads * hd;
        assert!(width > 0 && q.len().is_multiple_of(width), "attention: q is not rows of n_heads * head_dim");
        let n = q.len() / width;
        assert!(pos + n <= self.max_ctx, "attention: positions beyond the cache");
        if n == 0 {
            return Vec::new();
        }
        let blocks = n.div_ceil(TASK_TOKENS);
        let tasks = self.n_kv_heads * blocks;
        let keys = pos + n;
        let spans = keys.div_ceil(SPAN);
        let part_len = self.group() * TASK_TOKENS * (HEADER + hd);
        let mut parts = vec![0f32; tasks * spans * part_len];
        for_each_chunk(&mut parts, part_len, |i, part| {
            let (task, span) = (i / spans, i % spans);
            let (kv_head, block) = (task / blocks, task % blocks);
            let job = Task {
                attention: self,
                q,
                k: &k_cache[kv_head * self.max_ctx * hd..][..self.max_ctx * hd],
                v: &v_cache[kv_head * self.max_ctx * hd..][..self.max_ctx * hd],
                pos,
                kv_head,
                tokens: block * TASK_TOKENS..((block + 1) * TASK_TOKENS).min(n),
                span: span * SPAN..((span + 1) * SPAN).min(keys),
            };
            job.run(part);
        });
        self.merge(&parts, n, blocks, spans, part_len)
    }

    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The keys the query at `query_pos` sees.
    fn visible(&self, query_pos: usize) -> Range<usize> {
        self.window.map_or(0, |w| (query_pos + 1).saturating_sub(w))..query_pos + 1
    }

    /// Each row's output from its spans' partial results: weights rescaled to the largest
    /// maximum, outputs summed and divided by the weights' sum (one span: its output over its
    /// sum, as e^0 is exactly 1).
    fn merge(&self, parts: &[f32], n: usize, blocks: usize, spans: usize, part_len: usize) -> Vec<f32> {
        let (hd, group) = (self.head_dim, self.group());
        let mut out = vec![0f32; n * self.n_heads * hd];
        for (i, row_out) in out.chunks_exact_mut(hd).enumerate() {
            let (t, h) = (i / self.n_heads, i % self.n_heads);
            let (kv_head, g) = (h / group, h % group);
            let task = kv_head * blocks + t / TASK_TOKENS;
            let row = (t % TASK_TOKENS) * group + g;
            let partial = |s: usize| &parts[(task * spans + s) * part_len + row * (HEADER + hd)..][..HEADER + hd];
            let max = (0..spans).map(|s| partial(s)[0]).fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for s in 0..spans {
                let p = partial(s);
                if p[1] == 0.0 {
                    continue;
                }
                let rescale = (p[0] - max).exp();
                total += rescale * p[1];
                row_out.iter_mut().zip(&p[HEADER..]).for_each(|(o, v)| *o += rescale * v);
            }
            if total > 0.0 {
                row_out.iter_mut().for_each(|o| *o /= total);
            }
        }
        out
    }
}

/// One task: a KV head's query rows for some tokens, over one span of keys.
struct Task<'a, E> {
    attention: &'a Attention,
    q: &'a [f32],
    /// The KV head's keys and values, `[position][head_dim]`.
    k: &'a [E],
    v: &'a [E],
    pos: usize,
    kv_head: usize,
    tokens: Range<usize>,
    span: Range<usize>,
}

impl<E: CacheValue> Task<'_, E> {
    /// Writes each row's partial result into `part` (`[row][HEADER + head_dim]`).
    fn run(&self, part: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
            return unsafe { self.run_avx2(part) };
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return self.run_with::<crate::arch::wasm::lanes::Simd128>(part);
        #[allow(unreachable_code)]
        self.run_with::<lanes::Portable>(part)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2(&self, part: &mut [f32]) {
        self.run_with::<x86::lanes::Avx2>(part)
    }

    /// `run` in the SIMD lanes `L` (inlined into `run_avx2`, where AVX2's are allowed).
    #[inline(always)]
    fn run_with<L: Lanes>(&self, part: &mut [f32]) {
        let a = self.attention;
        let (hd, group) = (a.head_dim, a.group());
        // Row r is token tokens.start + r / group, query head kv_head * group + r % group.
        let rows: Vec<(&[f32], Range<usize>)> = self
            .tokens
            .clone()
            .flat_map(|t| {
                let seen = a.visible(self.pos + t);
                let start = seen.start.max(self.span.start);
                let range = start..seen.end.min(self.span.end).max(start);
                (0..group).map(move |g| (&self.q[(t * a.n_heads + self.kv_head * group + g) * hd..][..hd], range.clone()))
            })
            .collect();
        let first = rows.iter().map(|(_, r)| r.start).min().unwrap_or(0);
        let end = rows.iter().map(|(_, r)| r.end).max().unwrap_or(0);
        let keys = end.saturating_sub(first);
        let mut weights = vec![0f32; rows.len() * keys];
        if keys > 0 {
            self.scores::<L>(&rows, first, keys, &mut weights);
        }
        for (r, (_, range)) in rows.iter().enumerate() {
            let w = &mut weights[r * keys..][..keys];
            let (max, total) = self.softmax_weights::<L>(w, range.start - first..range.end - first);
            let header = &mut part[r * (HEADER + hd)..][..HEADER];
            header.copy_from_slice(&[max, total]);
        }
        if keys > 0 {
            self.values::<L>(&weights, rows.len(), first, keys, part);
        }
    }

    /// `weights[r][j] = q_r · k_{first + j}` for every row and key of the task.
    #[inline(always)]
    fn scores<L: Lanes>(&self, rows: &[(&[f32], Range<usize>)], first: usize, keys: usize, weights: &mut [f32]) {
        let hd = self.attention.head_dim;
        for r0 in (0..rows.len()).step_by(ROW_TILE) {
            // Past the last row or key, a tile repeats it and its sums are not stored.
            let qs: [&[f32]; ROW_TILE] = std::array::from_fn(|i| rows[(r0 + i).min(rows.len() - 1)].0);
            for j0 in (0..keys).step_by(KEY_TILE) {
                let ks: [&[E]; KEY_TILE] = std::array::from_fn(|j| &self.k[(first + (j0 + j).min(keys - 1)) * hd..][..hd]);
                let tile = score_tile::<L, E>(&qs, &ks);
                for (i, sums) in tile.iter().enumerate().take(rows.len() - r0) {
                    for (j, &s) in sums.iter().enumerate().take(keys - j0) {
                        weights[(r0 + i) * keys + j0 + j] = s;
                    }
                }
            }
        }
    }

    /// A row's dot products as softmax weights: scaled (and soft-capped), the maximum over the
    /// keys in `seen` subtracted, exponentiated; 0 for the keys it does not see. Returns the
    /// maximum and the weights' sum (−∞ and 0 when it sees none in this span).
    #[inline(always)]
    fn softmax_weights<L: Lanes>(&self, w: &mut [f32], seen: Range<usize>) -> (f32, f32) {
        let a = self.attention;
        w[..seen.start].fill(0.0);
        w[seen.end..].fill(0.0);
        let scores = &mut w[seen];
        match a.softcap {
            Some(cap) => scores.iter_mut().for_each(|s| *s = cap * (a.scale * *s / cap).tanh()),
            None => scores.iter_mut().for_each(|s| *s *= a.scale),
        }
        let mut chunks = scores.chunks_exact_mut(LANES);
        let mut max = L::splat(f32::NEG_INFINITY);
        for c in &mut chunks {
            max = max.max(L::load(c));
        }
        let max = chunks.into_remainder().iter().fold(max.max_lane(), |m, &s| m.max(s));
        let (mut total, mut chunks) = (L::zero(), scores.chunks_exact_mut(LANES));
        for c in &mut chunks {
            let e = L::load(c).sub(L::splat(max)).exp();
            e.store(c);
            total = total.add(e);
        }
        let mut total = total.sum();
        for s in chunks.into_remainder() {
            *s = L::splat(*s - max).exp().first();
            total += *s;
        }
        (max, total)
    }

    /// Each row's `Σ_j weights[r][j] · v_{first + j}` into its part after the header.
    #[inline(always)]
    fn values<L: Lanes>(&self, weights: &[f32], rows: usize, first: usize, keys: usize, part: &mut [f32]) {
        let hd = self.attention.head_dim;
        let v = &self.v[first * hd..][..keys * hd];
        for r0 in (0..rows).step_by(ROW_TILE) {
            let ws: [&[f32]; ROW_TILE] = std::array::from_fn(|i| &weights[(r0 + i).min(rows - 1) * keys..][..keys]);
            let mut d0 = 0;
            while d0 < hd {
                let dims = (hd - d0).min(DIM_TILE);
                let mut tile = [[0f32; DIM_TILE]; ROW_TILE];
                match dims {
                    DIM_TILE => value_tile::<L, E, 2>(&ws, v, hd, d0, &mut tile),
                    LANES.. => value_tile::<L, E, 1>(&ws, v, hd, d0, &mut tile),
                    _ => value_tail(&ws, v, hd, d0, &mut tile),
                }
                let dims = if dims >= LANES { dims / LANES * LANES } else { dims };
                for (i, sums) in tile.iter().enumerate().take(rows - r0) {
                    part[(r0 + i) * (HEADER + hd) + HEADER + d0..][..dims].copy_from_slice(&sums[..dims]);
                }
                d0 += dims;
            }
        }
    }
}

/// `q_i · k_j` for a tile of rows and keys: `LANES` partial sums each, over the head's
/// dimensions in steps of `LANES`, then added; the dimensions after the last whole step one by one.
#[inline(always)]
fn score_tile<L: Lanes, E: CacheValue>(qs: &[&[f32]; ROW_TILE], ks: &[&[E]; KEY_TILE]) -> [[f32; KEY_TILE]; ROW_TILE] {
    let hd = qs[0].len();
    let body = hd / LANES * LANES;
    let mut acc = [[L::zero(); KEY_TILE]; ROW_TILE];
    for c in (0..body).step_by(LANES) {
        // Loops rather than `array::from_fn`, whose closures are not inlined into the AVX2 caller.
        let mut k = [L::zero(); KEY_TILE];
        for (k, key) in k.iter_mut().zip(ks) {
            *k = E::load(&key[c..c + LANES]);
        }
        for (acc, q) in acc.iter_mut().zip(qs) {
            let q = L::load(&q[c..c + LANES]);
            for (acc, &k) in acc.iter_mut().zip(&k) {
                *acc = q.mul_add(k, *acc);
            }
        }
    }
    let mut sums = [[0f32; KEY_TILE]; ROW_TILE];
    for ((sums, acc), q) in sums.iter_mut().zip(&acc).zip(qs) {
        for ((sum, acc), k) in sums.iter_mut().zip(acc).zip(ks) {
            let tail: f32 = q[body..].iter().zip(&k[body..hd]).map(|(a, &b)| a * b.to_f32()).sum();
            *sum = acc.sum() + tail;
        }
    }
    sums
}

/// `Σ_j w_i[j] · v_j[d0..d0 + C·LANES]` for a tile of rows into `out`'s first `C·LANES`
/// columns (`v`: the span's value rows of `hd`).
#[inline(always)]
fn value_tile<L: Lanes, E: CacheValue, const C: usize>(
    ws: &[&[f32]; ROW_TILE],
    v: &[E],
    hd: usize,
    d0: usize,
    out: &mut [[f32; DIM_TILE]; ROW_TILE],
) {
    let mut acc = [[L::zero(); C]; ROW_TILE];
    for (j, v_row) in v.chunks_exact(hd).enumerate() {
        let mut vs = [L::zero(); C];
        for (c, x) in vs.iter_mut().enumerate() {
            *x = E::load(&v_row[d0 + c * LANES..d0 + (c + 1) * LANES]);
        }
        for (acc, w) in acc.iter_mut().zip(ws) {
            let w = L::splat(w[j]);
            for (acc, &x) in acc.iter_mut().zip(&vs) {
                *acc = w.mul_add(x, *acc);
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(&acc) {
        for (c, a) in acc.iter().enumerate() {
            a.store(&mut out[c * LANES..(c + 1) * LANES]);
        }
    }
}

/// `value_tile` for the last `hd - d0` (< `LANES`) dimensions, one at a time.
fn value_tail<E: CacheValue>(ws: &[&[f32]; ROW_TILE], v: &[E], hd: usize, d0: usize, out: &mut [[f32; DIM_TILE]; ROW_TILE]) {
    for (out, w) in out.iter_mut().zip(ws) {
        for (j, v_row) in v.chunks_exact(hd).enumerate() {
            for (o, x) in out.iter_mut().zip(&v_row[d0..]) {
                *o += w[j] * x.to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lanes' `exp` within 2 units in the last place of e^x over the softmax's range.
    fn check_exp<L: Lanes>(name: &str) {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let lanes: [f32; LANES] = std::array::from_fn(|l| (x - l as f32 * 1e-3).max(-87.0));
            let mut got = [0f32; LANES];
            L::load(&lanes).exp().store(&mut got);
            for (&x, &g) in lanes.iter().zip(&got) {
                let want = f64::from(x).exp();
                let ulp = f64::from(f32::EPSILON) * want;
                worst = worst.max((f64::from(g) - want).abs() / ulp);
            }
            x += 0.0137;
        }
        assert!(worst <= 2.0, "{name}: exp off by {worst} ulp");
    }

    #[test]
    fn lanes_exp_is_within_two_ulp() {
        check_exp::<lanes::Portable>("portable");
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx2() {
            check_exp::<x86::lanes::Avx2>("avx2");
        }
    }
}
