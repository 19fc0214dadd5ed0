//! Weight rows interleaved in groups of 8 for the products that sum 8 rows at once: 4-bit levels
//! (`nibbles`), and byte and 6-bit ones (`bytes`). What the layouts share: where a row's scales
//! and offsets lie. The products over either layout, their shape checks and choice of code, are
//! `products` (the SIMD tiles, which read the layouts, are `arch::x86::interleaved` and
//! `arch::x86::interleaved_bytes`).

pub(crate) mod bytes;
pub(crate) mod nibbles;
mod products;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
use crate::arch::x86;
pub(crate) use products::products;
#[cfg(test)]
pub(crate) use products::WovenRows;

/// Rows a group interleaves: one per lane of an AVX2 vector of i32 or f32.
pub(crate) const GROUP_ROWS: usize = 8;

/// Where the scale (or offset) of row `r`'s block `b` lies in the interleaved scales.
#[inline]
pub(crate) fn value_index(r: usize, b: usize, blocks: usize) -> usize {
    (r / GROUP_ROWS * blocks + b) * GROUP_ROWS + r % GROUP_ROWS
}

/// `rows` rows of one value per block (`blocks` a row), interleaved; `back` undoes it.
pub(crate) fn interleave_values<T: Copy + Default>(values: &[T], rows: usize, blocks: usize, back: bool) -> Vec<T> {
    let mut out = vec![T::default(); values.len()];
    for r in 0..rows {
        for b in 0..blocks {
            let (plain, woven) = (r * blocks + b, value_index(r, b, blocks));
            if back {
                out[plain] = values[woven];
            } else {
                out[woven] = values[plain];
            }
        }
    }
    out
}

/// Whether this machine runs the interleaved products with SIMD (else a matrix keeps its rows
/// one after another, for the row-by-row kernels).
pub(crate) fn has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::has_avx2();
    #[cfg(not(target_arch = "x86_64"))]
    false
}
