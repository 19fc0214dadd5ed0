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

/// LayerNorm, as ggml's `ggml_norm` followed by the weight and bias: `out[t][i] = (x[t][i] -
/// mean) / sqrt(var + eps) * weight[i] + bias[i]`, mean and variance accumulated in f64.
///
/// Panics if `x.len()` is not a multiple of `weight.len()` or `bias` differs in length.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let n = weight.len();
    assert!(n > 0 && x.len().is_multiple_of(n) && bias.len() == n, "layer_norm: {} values are not rows of {n}", x.len());
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
        let scale = 1.0 / (var + f64::from(eps)).sqrt();
        out.extend(
            row.iter().zip(weight).zip(bias).map(|((&v, &w), &b)| ((f64::from(v) - mean) * scale * f64::from(w) + f64::from(b)) as f32),
        );
    }
    out
}
