//! Dot products of one weight row with one activation row: 8-bit activation levels times the
//! weights' integer levels (4-bit in nibbles, or a byte each), a scale per group of 16 or 32
//! weights (plus the offsets times the activations' group sums), and f32 times f32. The
//! instruction set is chosen once per process: AVX2 with FMA where the CPU has them, wasm's
//! simd128 in a wasm build with it, else portable code (`portable`). The kernels of each
//! instruction set are `arch`'s.

mod portable;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use kestrel_ops::f32_dot_portable;

use crate::activations::QuantizedRows;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use crate::arch::wasm;
#[cfg(target_arch = "x86_64")]
use crate::arch::x86;
use crate::rows::{ActRow, IntRow, IntRows};
use portable::int_dot_portable;

struct Kernels {
    name: &'static str,
    int: fn(IntRows<'_>, &QuantizedRows, &mut [f32]),
    /// `f32_products`: each result the same bits as the set's f32 dot product of its row and
    /// token.
    f32_products: fn(&[f32], &[f32], usize, &mut [f32]),
}

/// Every kernel set this machine runs, fastest first: the first is the one chosen.
fn available() -> Vec<Kernels> {
    let portable = Kernels {
        name: "portable",
        int: |w, x, out| products_by(w, x, out, int_dot_portable),
        f32_products: |w, x, cols, out| f32_products_by(w, x, cols, out, f32_dot_portable),
    };
    #[cfg(target_arch = "x86_64")]
    {
        let mut sets = Vec::new();
        if x86::has_avx2() {
            if x86::has_avx_vnni() {
                sets.push(Kernels {
                    name: "avx2+vnni",
                    int: x86::dot::int_products_vnni_checked,
                    f32_products: x86::f32_dot::f32_products_checked,
                });
            }
            sets.push(Kernels { name: "avx2", int: x86::dot::int_products_checked, f32_products: x86::f32_dot::f32_products_checked });
        }
        sets.push(portable);
        sets
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return vec![
        Kernels {
            name: "simd128",
            int: wasm::dot::products,
            // Tiles measured slower than one product at a time in V8 (8 against 18 sentences/s on
            // all-MiniLM): its arrays of v128 do not stay in registers.
            f32_products: |w, x, cols, out| f32_products_by(w, x, cols, out, wasm::dot::f32_dot),
        },
        portable,
    ];
    #[cfg(not(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128"))))]
    vec![portable]
}

fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| available().swap_remove(0))
}

/// The chosen kernel set's name, and `+avx512vnni` where the interleaved K-quant tiles take
/// AVX512-VNNI's `dpbusd` (`arch::x86::interleaved`, `arch::x86::interleaved_bytes`), which they
/// choose on their own.
pub(crate) fn simd_name() -> &'static str {
    let name = kernels().name;
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx512_vnni() {
        match name {
            "avx2" => return "avx2+avx512vnni",
            "avx2+vnni" => return "avx2+vnni+avx512vnni",
            _ => {}
        }
    }
    name
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows r of `w` and the n rows t of `x`, with
/// `w[e] = scale[g]·level[e] + offset[g]` and `x[e] ≈ d[e/32]·qx[e]`.
pub(crate) fn int_products(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    (kernels().int)(w, x, out)
}

/// `int_products` over one row-and-token dot product at a time.
fn products_by(w: IntRows<'_>, x: &QuantizedRows, out: &mut [f32], dot: fn(IntRow<'_>, ActRow<'_>) -> f32) {
    let n = x.rows(w.cols);
    let mut bufs = [Vec::new(), Vec::new()];
    for (r, ys) in out.chunks_exact_mut(n).enumerate().take(w.rows()) {
        let row = w.row(r, &mut bufs);
        for (t, y) in ys.iter_mut().enumerate() {
            *y = dot(row, x.row(t, w.cols));
        }
    }
}

/// `out[r·n + t] = w_r · x_t` for the rows r of `w` and the n rows t of `x` (`cols`
/// values each), every result the same bits as the kernel set's one dot product gives it, whatever n is: a matrix's
/// products then do not depend on how many tokens run together.
///
/// Panics if `w` or `x` is not whole rows of `cols` or `out` is not rows x n (a shape bug).
pub(crate) fn f32_products(w: &[f32], x: &[f32], cols: usize, out: &mut [f32]) {
    assert!(cols > 0 && w.len().is_multiple_of(cols) && x.len().is_multiple_of(cols), "f32_products: rows of {cols}");
    assert_eq!(out.len(), w.len() / cols * (x.len() / cols), "f32_products: out is not rows x tokens");
    (kernels().f32_products)(w, x, cols, out)
}

/// `f32_products` one dot product at a time.
fn f32_products_by(w: &[f32], x: &[f32], cols: usize, out: &mut [f32], dot: fn(&[f32], &[f32]) -> f32) {
    let n = x.len() / cols;
    for (w_row, ys) in w.chunks_exact(cols).zip(out.chunks_exact_mut(n)) {
        for (y, x_row) in ys.iter_mut().zip(x.chunks_exact(cols)) {
            *y = dot(w_row, x_row);
        }
    }
}
