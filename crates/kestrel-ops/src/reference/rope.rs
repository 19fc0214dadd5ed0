//! Rotary position embedding with llama.cpp's definitions (`ggml_rope_ext`), rotating all
//! `head_dim` dimensions of each head.
//!
//! Pair `i` (of `head_dim / 2`) of a head at position `p` is rotated by `theta_i = p * w_i` with
//! `e_i = base^(-2i / head_dim) / freq_factors[i]` (the extrapolated frequency) and
//! `w_i = e_i * (freq_scale * (1 - mix_i) + mix_i)`, where `mix_i` is YaRN's ramp (0 without
//! YaRN: plain or linearly scaled RoPE), and scaled by `mscale`:
//! `(x0, x1) -> mscale * (x0 cos - x1 sin, x0 sin + x1 cos)`. ggml computes the same angle as
//! `theta_interp * (1 - mix) + theta_extrap * mix` per position; per pair it is linear in `p`.

use crate::params::RopeConfig;

/// Rotates `x`, the heads of one token (`[n_heads][head_dim]`), for position `pos`.
///
/// Panics if `head_dim` is odd or does not divide `x.len()`, or if the config's freq factors
/// do not have `head_dim / 2` values (shape bugs of the caller).
pub fn rope(x: &[f32], head_dim: usize, pos: usize, config: &RopeConfig) -> Vec<f32> {
    assert!(head_dim.is_multiple_of(2) && x.len().is_multiple_of(head_dim), "rope: {} values, head_dim {head_dim}", x.len());
    if let Some(f) = &config.freq_factors {
        assert_eq!(f.len(), head_dim / 2, "rope: freq_factors must have head_dim / 2 values");
    }
    // Every head turns pair i by the same angle: computed once per pair.
    let turns: Vec<(f32, f32)> = (0..head_dim / 2)
        .map(|i| {
            let theta = pos as f64 * config.inv_freq(head_dim, i);
            (theta.sin() as f32 * config.mscale, theta.cos() as f32 * config.mscale)
        })
        .collect();
    let mut out = x.to_vec();
    for head in out.chunks_exact_mut(head_dim) {
        for (i, &(sin, cos)) in turns.iter().enumerate() {
            let (a, b) = config.pair(head_dim, i);
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
    out
}
