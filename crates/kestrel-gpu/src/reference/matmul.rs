//! Reference matrix products: `y = x·Wᵀ` with W dequantized to f32 (N rows of K), and the
//! gated (SwiGLU, GeGLU) gate/up projection.

use kestrel_gguf::{quant, GgmlType};

use crate::params::GateActivation;
use crate::GpuError;

/// `y[m][n] = Σ_k x[m][k]·w[n][k]` for x `[m][k]`, w `[n][k]`, y `[m][n]`, all row-major.
pub fn matmul(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "matmul: x is not {m} x {k}");
    assert_eq!(w.len(), n * k, "matmul: w is not {n} x {k}");
    let mut y = Vec::with_capacity(m * n);
    for x_row in x.chunks_exact(k) {
        for w_row in w.chunks_exact(k) {
            y.push(x_row.iter().zip(w_row).map(|(a, b)| a * b).sum());
        }
    }
    y
}

/// `out[m][n] = act(x[m]·gate[n]) * (x[m]·up[n])`.
pub fn gated(x: &[f32], m: usize, gate: &[f32], up: &[f32], n: usize, k: usize, act: GateActivation) -> Vec<f32> {
    let g = matmul(x, m, gate, n, k);
    let u = matmul(x, m, up, n, k);
    g.into_iter().zip(u).map(|(g, u)| act.apply(g) * u).collect()
}

/// The f32 values of a `rows` x `cols` weight matrix stored as GGUF bytes of type `ty`.
pub fn dequantize_weights(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>, GpuError> {
    let mut values = vec![0.0; rows * cols];
    quant::dequantize(ty, bytes, &mut values)?;
    Ok(values)
}
