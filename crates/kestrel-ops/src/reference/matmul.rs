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
/// shares. Large products split their weight rows over the machine's threads (`row_threads`):
/// every sum is the same dot product in the same order wherever it runs, so the result is bit
/// for bit the one-thread one.
pub fn matmul(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "matmul: x is not {m} x {k}");
    assert_eq!(w.len(), n * k, "matmul: w is not {n} x {k}");
    let mut y = vec![0.0; m * n];
    if k == 0 || m == 0 {
        return y;
    }
    // Feature-major (`by_row[j][i]`): each thread writes its own run of weight rows' outputs.
    let dots = |w_rows: &[f32], out: &mut [f32]| {
        for (w_row, out) in w_rows.chunks_exact(k).zip(out.chunks_exact_mut(m)) {
            for (o, x_row) in out.iter_mut().zip(x.chunks_exact(k)) {
                *o = f32_dot_portable(x_row, w_row);
            }
        }
    };
    let mut by_row = vec![0.0; n * m];
    let rows_per_thread = n.div_ceil(row_threads(m * n * k));
    if rows_per_thread >= n {
        dots(w, &mut by_row);
    } else {
        std::thread::scope(|scope| {
            for (w_rows, out) in w.chunks(rows_per_thread * k).zip(by_row.chunks_mut(rows_per_thread * m)) {
                scope.spawn(move || dots(w_rows, out));
            }
        });
    }
    for (j, outs) in by_row.chunks_exact(m).enumerate() {
        for (i, &o) in outs.iter().enumerate() {
            y[i * n + j] = o;
        }
    }
    y
}

/// Threads for a product of `macs` multiply-adds: the machine's (one in wasm, which has none to
/// spawn), where each gets at least a few million; one for small products, whose thread start
/// would cost more than it saves.
fn row_threads(macs: usize) -> usize {
    const MIN_MACS_PER_THREAD: usize = 1 << 22;
    let cores = if cfg!(target_arch = "wasm32") { 1 } else { std::thread::available_parallelism().map_or(1, |t| t.get()) };
    cores.min(macs / MIN_MACS_PER_THREAD).max(1)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A product large enough to split over threads (where the machine has two or more) gives
    /// each element as the one dot product of its row of x and its row of w, bit for bit, at its
    /// place: an odd row count leaves a short last run.
    #[test]
    fn split_products_are_each_elements_own_dot() {
        let (m, n, k) = (3, 2001, 2048);
        assert!(m * n * k >= 2 << 22, "the product must be large enough for two threads");
        let value = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 256.0;
        let x: Vec<f32> = (0..m * k).map(value).collect();
        let w: Vec<f32> = (0..n * k).map(|i| value(i + 13)).collect();
        let y = matmul(&x, m, &w, n, k);
        for i in 0..m {
            for j in 0..n {
                let want = f32_dot_portable(&x[i * k..][..k], &w[j * k..][..k]);
                assert_eq!(y[i * n + j].to_bits(), want.to_bits(), "y[{i}][{j}]");
            }
        }
    }
}
