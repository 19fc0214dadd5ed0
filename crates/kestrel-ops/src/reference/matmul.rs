//! Reference matrix products: `y = x·Wᵀ` with W dequantized to f32 (N rows of K), and the
//! gated (SwiGLU, GeGLU) gate/up projection.

use kestrel_gguf::{quant, GgmlType, GgufError};

use crate::f32_dot_portable;
use crate::params::GateActivation;

/// `y[m][n] = Σ_k x[m][k]·w[n][k]` for x `[m][k]`, w `[n][k]`, y `[m][n]`, all row-major.
///
/// Each weight row is read once for all m rows of x (which stay in cache): a 200-token prompt
/// through a 135M-parameter model otherwise streams its half-gigabyte of f32 weights 200 times.
/// The sums are the portable 8-lane dot product (`f32_dot_portable`), which the CPU backend
/// shares.
pub fn matmul(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "matmul: x is not {m} x {k}");
    assert_eq!(w.len(), n * k, "matmul: w is not {n} x {k}");
    let mut y = vec![0.0; m * n];
    if k == 0 {
        return y;
    }
    for (j, w_row) in w.chunks_exact(k).enumerate() {
        for (i, x_row) in x.chunks_exact(k).enumerate() {
            y[i * n + j] = f32_dot_portable(x_row, w_row);
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
pub fn dequantize_weights(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>, GgufError> {
    let mut values = vec![0.0; rows * cols];
    quant::dequantize(ty, bytes, &mut values)?;
    Ok(values)
}
