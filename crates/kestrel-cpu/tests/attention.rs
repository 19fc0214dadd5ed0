//! The CPU attention against the textbook softmax in f64, for prefill chunks and single decode
//! tokens (whose keys split into spans), grouped and plain heads, head sizes with and without
//! whole tiles, a sliding window and a soft cap; caches of f16 values stored as f16 or as f32.

use kestrel_cpu::{Attention, KvRows};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `softmax(scale · q·k) · v` per query row in f64: query `t` at `pos + t` sees the keys the
/// window leaves it up to its own position.
fn textbook(a: &Attention, q: &[f32], k: &[f32], v: &[f32], pos: usize) -> Vec<f64> {
    let hd = a.head_dim;
    let n = q.len() / (a.n_heads * hd);
    let mut out = Vec::with_capacity(q.len());
    for t in 0..n {
        let query_pos = pos + t;
        let first = a.window.map_or(0, |w| (query_pos + 1).saturating_sub(w));
        for h in 0..a.n_heads {
            let kv_head = h / (a.n_heads / a.n_kv_heads);
            let row = |cache: &[f32], p: usize| cache[(kv_head * a.max_ctx + p) * hd..][..hd].to_vec();
            let qh = &q[(t * a.n_heads + h) * hd..][..hd];
            let scores: Vec<f64> = (first..=query_pos)
                .map(|p| {
                    let s = f64::from(a.scale) * qh.iter().zip(row(k, p)).map(|(&x, y)| f64::from(x) * f64::from(y)).sum::<f64>();
                    a.softcap.map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..hd {
                out.push((first..=query_pos).zip(&weights).map(|(p, w)| w * f64::from(row(v, p)[d])).sum::<f64>() / total);
            }
        }
    }
    out
}

/// f32 rounding's bound on the difference, for components of q, k and v in [-1, 1]: a score's
/// sum of `hd` products is off by at most `hd · u · hd` (u = 2^-24, each partial sum at most hd),
/// times the scale; exp turns a score error e into a relative weight error of about e (plus a
/// few u), which moves the output, a weighted mean of values at most 1, by at most twice that;
/// the weighted sums of `keys` terms and the division add `(keys + 2) · u` relative error.
fn bound(a: &Attention, keys: usize) -> f64 {
    let u = f64::from(f32::EPSILON) / 2.0;
    let hd = a.head_dim as f64;
    let score = hd * hd * u * f64::from(a.scale);
    2.0 * (score + 4.0 * u) + (keys as f64 + 2.0) * u
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Values an f16 cache holds (every few an exact zero or a subnormal), as f16 bits.
fn halves(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| match i % 97 {
            0 => 0,
            1 => 0x8000 | (i % 0x3ff) as u16,
            _ => half::f16::from_f32(rng.random_range(-1.0f32..1.0)).to_bits(),
        })
        .collect()
}

fn widen(h: &[u16]) -> Vec<f32> {
    h.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect()
}

fn check(a: Attention, pos: usize, n: usize, rng: &mut StdRng) {
    let cache = a.n_kv_heads * a.max_ctx * a.head_dim;
    let (k, v) = (random(rng, cache), random(rng, cache));
    let q = random(rng, n * a.n_heads * a.head_dim);
    let got = a.apply(&q, KvRows::F32 { k: &k, v: &v }, pos);
    let want = textbook(&a, &q, &k, &v, pos);
    assert_eq!(got.len(), want.len());
    let limit = bound(&a, pos + n);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((f64::from(*g) - w).abs() <= limit, "{a:?} pos {pos} n {n} [{i}]: {g} vs {w} (bound {limit:e})");
    }
}

fn attention(n_heads: usize, n_kv_heads: usize, head_dim: usize, max_ctx: usize) -> Attention {
    Attention { n_heads, n_kv_heads, head_dim, max_ctx, scale: 1.0 / (head_dim as f32).sqrt(), softcap: None, window: None }
}

#[test]
fn grouped_heads_prefill_and_decode_match_the_textbook_softmax() {
    let mut rng = StdRng::seed_from_u64(11);
    // SmolLM2's shape: 9 heads over 3 KV heads of 64.
    let a = attention(9, 3, 64, 1100);
    check(a, 0, 1, &mut rng);
    check(a, 0, 13, &mut rng);
    check(a, 40, 70, &mut rng);
    // Decode steps deep in the context: the keys split into spans, merged.
    check(a, 1000, 1, &mut rng);
    check(a, 1097, 3, &mut rng);
}

#[test]
fn other_shapes_windows_and_soft_caps_match_the_textbook_softmax() {
    let mut rng = StdRng::seed_from_u64(12);
    // Plain heads; 4 heads a KV head; head sizes past whole tiles (72: a last 8; 36: last 4).
    for a in [attention(4, 4, 64, 700), attention(8, 2, 72, 700), attention(6, 3, 36, 700)] {
        check(a, 0, 9, &mut rng);
        check(a, 650, 1, &mut rng);
        check(a, 300, 6, &mut rng);
    }
    let windowed = Attention { window: Some(100), ..attention(8, 4, 64, 900) };
    check(windowed, 0, 130, &mut rng);
    check(windowed, 850, 1, &mut rng);
    check(windowed, 600, 5, &mut rng);
    let capped = Attention { softcap: Some(0.5), ..attention(8, 4, 64, 600) };
    check(capped, 0, 20, &mut rng);
    check(capped, 560, 1, &mut rng);
}

/// A token's output has the same bits in a prefill chunk as in a decode step, at a context of
/// several spans (where a decode step splits its keys over the threads).
#[test]
fn a_token_gives_the_same_bits_in_a_chunk_and_alone() {
    let mut rng = StdRng::seed_from_u64(13);
    for a in [attention(9, 3, 64, 1400), Attention { window: Some(700), ..attention(8, 2, 72, 1400) }] {
        let cache = a.n_kv_heads * a.max_ctx * a.head_dim;
        let (k, v) = (random(&mut rng, cache), random(&mut rng, cache));
        let (pos, n, width) = (1100, 37, a.n_heads * a.head_dim);
        let q = random(&mut rng, n * width);
        let kv = KvRows::F32 { k: &k, v: &v };
        let chunk = a.apply(&q, kv, pos);
        for t in 0..n {
            let alone = a.apply(&q[t * width..][..width], kv, pos + t);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&chunk[t * width..][..width]), "{a:?}: token {t}");
        }
    }
}

/// An f16 cache's values give the same bits stored as f16 as stored as f32, and are within the
/// bound of the textbook softmax.
#[test]
fn f16_storage_gives_the_f32_storages_bits() {
    let mut rng = StdRng::seed_from_u64(14);
    for a in [attention(9, 3, 64, 1200), attention(6, 3, 36, 1200)] {
        let cache = a.n_kv_heads * a.max_ctx * a.head_dim;
        let (k16, v16) = (halves(&mut rng, cache), halves(&mut rng, cache));
        let (k, v) = (widen(&k16), widen(&v16));
        for (pos, n) in [(0, 30), (1150, 1), (700, 9)] {
            let q = random(&mut rng, n * a.n_heads * a.head_dim);
            let stored16 = a.apply(&q, KvRows::F16 { k: &k16, v: &v16 }, pos);
            let stored32 = a.apply(&q, KvRows::F32 { k: &k, v: &v }, pos);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&stored16), bits(&stored32), "{a:?} pos {pos} n {n}");
            let want = textbook(&a, &q, &k, &v, pos);
            let limit = bound(&a, pos + n);
            assert!(stored16.iter().zip(&want).all(|(g, w)| (f64::from(*g) - w).abs() <= limit), "{a:?} pos {pos} n {n}");
        }
    }
}
