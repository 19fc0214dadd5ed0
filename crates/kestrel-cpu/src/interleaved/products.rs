//! The products over both interleaved layouts: what `products` needs of each (`WovenRows`),
//! the portable products one weight at a time (the reference the SIMD tiles are tested against),
//! and the choice of code: the tiles of whole scales (AVX2's, or AVX512-VNNI's where the CPU
//! has it), or the factored tiles that sum a K-quant's super-block in i32 (`arch::x86`). Kept apart from the layouts so that the SIMD
//! tiles, which read the layouts, and the layouts import nothing of each other both ways.

use super::bytes::ByteGroupRows;
#[cfg(target_arch = "x86_64")]
use super::has_simd;
use super::nibbles::{byte_index, GroupRows, ROW_BLOCK_BYTES};
use super::{value_index, GROUP_ROWS};
use crate::activations::QuantizedRows;
#[cfg(target_arch = "x86_64")]
use crate::arch::x86::{self, interleaved, interleaved_bytes, scales::FactoredLanes, tiles::FactoredRows};
use crate::ACT_BLOCK;

/// Consecutive whole groups of interleaved rows in one of the layouts (`nibbles::GroupRows`,
/// `bytes::ByteGroupRows`): what `products` needs of each.
pub(crate) trait WovenRows: Copy {
    /// The products' name in a shape panic.
    const PRODUCTS: &'static str;

    fn cols(&self) -> usize;

    fn rows(&self) -> usize;

    /// Whether the levels, scales and offsets are those of `rows` whole rows (which the SIMD
    /// code's unchecked loads rely on).
    fn holds(&self, rows: usize) -> bool;

    /// The products one weight at a time: the reference the SIMD code is tested against.
    fn products_portable(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize);

    /// The products of the tiles that read whole scales and offsets of any storage: AVX2's, or
    /// with AVX512-VNNI's `dpbusd` where `vnni` and the layout has such tiles.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present, AVX512-VNNI (`x86::has_avx512_vnni`) where `vnni`, and
    /// `self`, `x` and `out` have the shapes `products` checks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn whole_products(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool);

    /// The rows with their factored scales and offsets, where a K-quant's products with `x`
    /// take the factored tiles that sum a super-block in i32 (None: another case).
    #[cfg(target_arch = "x86_64")]
    fn factored(&self, x: &QuantizedRows) -> Option<FactoredRows<'_, Self>>;

    /// The products of the factored tiles, with AVX512-VNNI's `dpbusd` where `vnni`.
    ///
    /// # Safety
    /// As `whole_products`'s, `w` is `factored`'s, and AVX512-VNNI (`x86::has_avx512_vnni`) is
    /// present where `vnni`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn factored_products(w: FactoredRows<'_, Self>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool);
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows of `w` and the `n` rows of `x` (as
/// `dot::int_products`).
pub(crate) fn products<W: WovenRows>(w: W, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = (w.rows(), x.rows(w.cols()));
    assert!(
        w.cols().is_multiple_of(ACT_BLOCK)
            && rows.is_multiple_of(GROUP_ROWS)
            && w.holds(rows)
            && out.len() == rows * n
            && x.d.len() * ACT_BLOCK == x.q.len(),
        "{}: shapes differ",
        W::PRODUCTS
    );
    #[cfg(target_arch = "x86_64")]
    if has_simd() {
        // SAFETY: AVX2, FMA and F16C are present (and AVX512-VNNI where the tiles are told it
        // is); the shapes were checked above, and every load reads within the group's levels and
        // scales and a token's activation row.
        unsafe {
            match w.factored(x) {
                Some(factored) => W::factored_products(factored, x, out, rows, n, x86::has_avx512_vnni()),
                None => w.whole_products(x, out, rows, n, x86::has_avx512_vnni()),
            }
        }
        return;
    }
    w.products_portable(x, out, rows, n);
}

impl WovenRows for GroupRows<'_> {
    const PRODUCTS: &'static str = "interleaved products";

    fn cols(&self) -> usize {
        self.cols
    }

    fn rows(&self) -> usize {
        self.levels.len() * 2 / self.cols
    }

    fn holds(&self, rows: usize) -> bool {
        self.scale.len() * ACT_BLOCK == rows * self.cols && self.offset.is_none_or(|o| o.len() == self.scale.len())
    }

    fn products_portable(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
        let w = self;
        let blocks = w.cols / ACT_BLOCK;
        for r in 0..rows {
            for t in 0..n {
                let act = x.row(t, w.cols);
                let mut sum = 0f32;
                for b in 0..blocks {
                    let levels = (0..ACT_BLOCK).map(|e| {
                        let byte = w.levels[byte_index(r, b, e % ROW_BLOCK_BYTES, blocks)];
                        i32::from(if e < ROW_BLOCK_BYTES { byte & 0x0F } else { byte >> 4 })
                    });
                    let isum: i32 = levels.zip(&act.q[b * ACT_BLOCK..][..ACT_BLOCK]).map(|(l, &q)| l * i32::from(q)).sum();
                    let at = value_index(r, b, blocks);
                    sum += w.scale.get(at) * (act.d[b] * isum as f32 - w.bias * act.sums32[b]);
                    if let Some(offset) = w.offset {
                        sum += offset.get(at) * act.sums32[b];
                    }
                }
                out[r * n + t] = sum;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn whole_products(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
        interleaved::products(self, x, out, rows, n, vnni)
    }

    /// Q4_K's: Q4_0's bias takes the tiles of whole scales.
    #[cfg(target_arch = "x86_64")]
    fn factored(&self, x: &QuantizedRows) -> Option<FactoredRows<'_, Self>> {
        let (scale, offset) = FactoredLanes::super_blocks(self.scale, self.offset, ACT_BLOCK, self.cols, x).filter(|_| self.bias == 0.0)?;
        Some(FactoredRows { rows: *self, scale, offset })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn factored_products(w: FactoredRows<'_, Self>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
        interleaved::factored_products(w, x, out, rows, n, vnni)
    }
}

impl WovenRows for ByteGroupRows<'_> {
    const PRODUCTS: &'static str = "interleaved byte products";

    fn cols(&self) -> usize {
        self.cols
    }

    fn rows(&self) -> usize {
        self.levels.len() / self.cols
    }

    fn holds(&self, rows: usize) -> bool {
        matches!(self.group, 16 | 32)
            && self.levels.whole(self.cols)
            && self.scale.len() * self.group == rows * self.cols
            && self.offset.is_none_or(|o| o.len() == self.scale.len() && self.group == ACT_BLOCK)
    }

    fn products_portable(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
        let w = self;
        let (blocks, groups) = (w.cols / ACT_BLOCK, w.cols / w.group);
        for r in 0..rows {
            for t in 0..n {
                let act = x.row(t, w.cols);
                let mut sum = 0f32;
                for b in 0..blocks {
                    let q = &act.q[b * ACT_BLOCK..][..ACT_BLOCK];
                    for part in 0..ACT_BLOCK / w.group {
                        let range = part * w.group..(part + 1) * w.group;
                        let isum: i32 = range.map(|e| i32::from(w.levels.level(r, b, e, blocks)) * i32::from(q[e])).sum();
                        let at = value_index(r, b * ACT_BLOCK / w.group + part, groups);
                        sum += w.scale.get(at) * act.d[b] * isum as f32;
                    }
                    if let Some(offset) = w.offset {
                        sum += offset.get(value_index(r, b, groups)) * act.sums32[b];
                    }
                }
                out[r * n + t] = sum;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn whole_products(self, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
        interleaved_bytes::products(self, x, out, rows, n, vnni)
    }

    /// Q5_K's and Q6_K's.
    #[cfg(target_arch = "x86_64")]
    fn factored(&self, x: &QuantizedRows) -> Option<FactoredRows<'_, Self>> {
        let (scale, offset) = FactoredLanes::super_blocks(self.scale, self.offset, self.group, self.cols, x)?;
        Some(FactoredRows { rows: *self, scale, offset })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn factored_products(w: FactoredRows<'_, Self>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
        interleaved_bytes::factored_products(w, x, out, rows, n, vnni)
    }
}
