//! RMSNorm, as llama.cpp's `ggml_rms_norm` followed by the weight multiply.

/// `out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * weight[i]` for every row `t` of `x`
/// (rows of `weight.len()` values). The sum of squares is accumulated in f64, as ggml does.
///
/// Panics if `x.len()` is not a multiple of `weight.len()` (a shape bug of the caller).
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let n = weight.len();
    assert!(n > 0 && x.len().is_multiple_of(n), "rmsnorm: {} values are not rows of {n}", x.len());
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let sum_sq: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv_rms = (1.0 / (sum_sq / n as f64 + f64::from(eps)).sqrt()) as f32;
        out.extend(row.iter().zip(weight).map(|(&v, &w)| v * inv_rms * w));
    }
    out
}
