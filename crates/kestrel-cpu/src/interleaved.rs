//! Weight rows of 4-bit levels in groups of 8, interleaved so that one 32-byte load holds 4 level
//! bytes (8 weights) of each of the 8 rows, as llama.cpp's CPU build repacks Q4_0 for AVX2. A
//! `maddubs` of that load with 4 activation bytes broadcast to every lane then sums weights of
//! all 8 rows at once, so a block's integer sums end in the lanes as one vector of the 8 rows,
//! and the float work (convert, scale, accumulate) is done once per block for 8 rows instead of
//! once per row: about half the instructions per weight of the row-by-row tiles, for a decode
//! step (one token) and a prompt (a tile of up to 4) alike. Each group's blocks are one stream
//! of memory.
//!
//! Layout (`cols` weights a row, `blocks = cols / 32`): byte `m` of chunk `k` (0..4) of row `i`
//! (0..8) of row group `g`, block `b`, sits at `((g · blocks + b) · 4 + k) · 32 + 4 · i + m`, and
//! is byte `4k + m` of that row's block in `Levels::Nibbles` order (weight `4k + m` in its low
//! nibble, `16 + 4k + m` in its high one). Scales and offsets, one per 32 weights, are
//! interleaved alike: the value of row `i`, block `b` of group `g` at `(g · blocks + b) · 8 + i`.

use crate::activations::QuantizedRows;
use crate::dot::Scales;
use crate::ACT_BLOCK;

/// Rows a group interleaves: one per lane of an AVX2 vector of i32 or f32.
pub(crate) const GROUP_ROWS: usize = 8;
/// Bytes of one row's block (32 levels, two a byte).
const ROW_BLOCK_BYTES: usize = ACT_BLOCK / 2;

/// Where byte `j` (0..16) of row `r`'s block `b` lies in the interleaved levels.
#[inline]
pub(crate) fn byte_index(r: usize, b: usize, j: usize, blocks: usize) -> usize {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    ((g * blocks + b) * 4 + j / 4) * 32 + 4 * i + j % 4
}

/// Where the scale (or offset) of row `r`'s block `b` lies in the interleaved scales.
#[inline]
pub(crate) fn value_index(r: usize, b: usize, blocks: usize) -> usize {
    (r / GROUP_ROWS * blocks + b) * GROUP_ROWS + r % GROUP_ROWS
}

/// `rows` (a multiple of 8) rows of `Levels::Nibbles` levels, interleaved (a matrix writes its
/// levels to their places as it converts them; the tests build layouts with this).
#[cfg(test)]
pub(crate) fn interleave_levels(nibbles: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0u8; nibbles.len()];
    for r in 0..rows {
        for b in 0..blocks {
            let block = &nibbles[(r * blocks + b) * ROW_BLOCK_BYTES..][..ROW_BLOCK_BYTES];
            for (j, &byte) in block.iter().enumerate() {
                out[byte_index(r, b, j, blocks)] = byte;
            }
        }
    }
    out
}

/// The interleaved levels back in `Levels::Nibbles` order.
pub(crate) fn deinterleave_levels(levels: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0u8; levels.len()];
    for r in 0..rows {
        for b in 0..blocks {
            for j in 0..ROW_BLOCK_BYTES {
                out[(r * blocks + b) * ROW_BLOCK_BYTES + j] = levels[byte_index(r, b, j, blocks)];
            }
        }
    }
    out
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

/// Consecutive whole groups of interleaved rows: their levels, scales and offsets;
/// `w = scale · (level - bias) + offset` per block.
#[derive(Clone, Copy)]
pub(crate) struct GroupRows<'a> {
    pub levels: &'a [u8],
    pub scale: Scales<'a>,
    pub offset: Option<Scales<'a>>,
    /// What the stored levels exceed the format's by (8 for Q4_0, whose signed levels are kept
    /// as unsigned nibbles; 0 otherwise): applied as `-bias · scale` times the activations' block
    /// sums, so that Q4_0 needs no stored offsets (a tenth of the bytes a decode step streams).
    pub bias: f32,
    pub cols: usize,
}

impl GroupRows<'_> {
    fn rows(&self) -> usize {
        self.levels.len() * 2 / self.cols
    }
}

/// Whether this machine runs the interleaved products with SIMD (else a matrix keeps its rows
/// one after another, for the row-by-row kernels).
pub(crate) fn has_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows of `w` and the `n` rows of `x` (as
/// `dot::int_products`).
pub(crate) fn products(w: GroupRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = (w.rows(), x.rows(w.cols));
    assert!(
        w.cols.is_multiple_of(ACT_BLOCK)
            && rows.is_multiple_of(GROUP_ROWS)
            && w.scale.len() * ACT_BLOCK == rows * w.cols
            && w.offset.is_none_or(|o| o.len() == w.scale.len())
            && out.len() == rows * n
            && x.d.len() * ACT_BLOCK == x.q.len(),
        "interleaved products: shapes differ"
    );
    #[cfg(target_arch = "x86_64")]
    if has_simd() {
        // SAFETY: AVX2, FMA and F16C are present; the shapes were checked above, and every load
        // reads within the group's levels and scales and a token's activation row.
        unsafe { avx2::products(w, x, out, rows, n) };
        return;
    }
    products_portable(w, x, out, rows, n);
}

/// The products one weight at a time: the reference the SIMD code is tested against.
pub(crate) fn products_portable(w: GroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
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
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::{GroupRows, GROUP_ROWS, ROW_BLOCK_BYTES};
    use crate::activations::QuantizedRows;
    use crate::dot::avx2::{end_super_block, has_avx512_vnni, with_eight_scales, EightScales, FactoredLanes};
    use crate::dot::ActRow;
    use crate::ACT_BLOCK;

    /// Bytes of one group's block.
    const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * ROW_BLOCK_BYTES;
    /// Tokens a tile computes at most: each group's block is loaded (and split into nibbles) once
    /// for them. The AVX2 tiles take up to 4 (`TILE_TOKENS`), whose accumulators fit AVX2's 16
    /// vector registers; the factored AVX512-VNNI tiles (4-bit, byte and 6-bit levels) up to 8
    /// in its 32.
    pub(crate) const TOKENS: usize = 8;
    /// Tokens the tiles other than the factored AVX512-VNNI ones take at most.
    pub(crate) const TILE_TOKENS: usize = 4;

    /// Tokens a factored tile takes at most: `TOKENS` with AVX512-VNNI (`vnni`), else
    /// `TILE_TOKENS`.
    pub(crate) fn factored_tile_tokens(vnni: bool) -> usize {
        if vnni {
            TOKENS
        } else {
            TILE_TOKENS
        }
    }
    /// How far ahead of the block being read the levels are fetched into the cache, in bytes (a
    /// decode step streams every weight once; the hardware prefetchers stop at each 4 KiB page).
    pub(crate) const PREFETCH_BYTES: usize = 4096;

    /// A token tile's sums: `sums[token][row]` for a group's 8 rows, or a pair of groups' 16.
    pub(crate) type TileSums = [[f32; 2 * GROUP_ROWS]; TOKENS];

    /// `out[r·n + t]` for the `rows` weight rows (whole groups of 8) and the `n` rows of `x` (of
    /// `cols` values), tile by tile: `tile(g, pair, acts, tokens, sums)` computes group g's 8 rows
    /// (and group g + 1's, where `pair`) for the first `tokens` (at most `most`) of `acts` (a tile
    /// of fewer than `TOKENS` repeats its last row in the unused places), for the interleaved
    /// nibble and byte layouts alike. With `pairs` the groups go two at a time (the last alone
    /// where their count is odd).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn by_tiles(
        x: &QuantizedRows,
        cols: usize,
        rows: usize,
        n: usize,
        out: &mut [f32],
        most: usize,
        pairs: bool,
        mut tile: impl FnMut(usize, bool, &[ActRow<'_>; TOKENS], usize, &mut TileSums),
    ) {
        let acts: Vec<ActRow<'_>> = (0..n).map(|t| x.row(t, cols)).collect();
        // Each token tile's first token, count and rows, made once for every group (a decode
        // step's one tile would otherwise be rebuilt for each group of 8 weight rows).
        let width = most.clamp(1, TOKENS);
        let tiles: Vec<(usize, usize, [ActRow<'_>; TOKENS])> = (0..n)
            .step_by(width)
            .map(|t| {
                let tokens = (n - t).min(width);
                (t, tokens, std::array::from_fn(|i| acts[t + i.min(tokens - 1)]))
            })
            .collect();
        // A tile writes the sums of its tokens, and only those are read.
        let mut sums = [[0f32; 2 * GROUP_ROWS]; TOKENS];
        let groups = rows / GROUP_ROWS;
        let mut g = 0;
        while g < groups {
            let pair = pairs && g + 1 < groups;
            let tile_rows = if pair { 2 * GROUP_ROWS } else { GROUP_ROWS };
            for (t, tokens, tile_acts) in &tiles {
                tile(g, pair, tile_acts, *tokens, &mut sums);
                for (j, token) in sums.iter().enumerate().take(*tokens) {
                    for (i, &v) in token.iter().enumerate().take(tile_rows) {
                        out[(g * GROUP_ROWS + i) * n + t + j] = v;
                    }
                }
            }
            g += tile_rows / GROUP_ROWS;
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C are present, and `w`, `x` and `out` have the shapes `products` checks.
    pub(super) unsafe fn products(w: GroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
        if let Some((scale, offset)) = FactoredLanes::super_blocks(w.scale, w.offset, ACT_BLOCK, w.cols, x).filter(|_| w.bias == 0.0) {
            factored_products(&w, scale, offset, x, out, rows, n, has_avx512_vnni());
            return;
        }
        with_eight_scales!(w.scale, w.offset, |scale, offset| {
            by_tiles(x, w.cols, rows, n, out, TILE_TOKENS, false, |g, _, acts, tokens, sums| match tokens {
                // SAFETY: as this function's.
                4 => unsafe { tile::<4, _>(&w, scale, offset, g, acts, sums) },
                3 => unsafe { tile::<3, _>(&w, scale, offset, g, acts, sums) },
                2 => unsafe { tile::<2, _>(&w, scale, offset, g, acts, sums) },
                _ => unsafe { tile::<1, _>(&w, scale, offset, g, acts, sums) },
            })
        });
    }

    /// `products` of factored scales with Q8_K activations (`FactoredLanes::super_blocks`), with
    /// AVX512-VNNI's `dpbusd` on pairs of groups in 512-bit vectors where `vnni`
    /// (`pair_tile_vnni`).
    ///
    /// # Safety
    /// As `products`'s, the layout checked by `super_blocks`, and AVX512-VNNI (`has_avx512_vnni`)
    /// present where `vnni`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn factored_products(
        w: &GroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        x: &QuantizedRows,
        out: &mut [f32],
        rows: usize,
        n: usize,
        vnni: bool,
    ) {
        by_tiles(x, w.cols, rows, n, out, factored_tile_tokens(vnni), vnni, |g, pair, acts, tokens, sums| match (vnni, tokens) {
            // SAFETY: as this function's.
            (true, 8) => unsafe { pair_tile_vnni::<8>(w, scale, offset, g, pair, acts, sums) },
            (true, 7) => unsafe { pair_tile_vnni::<7>(w, scale, offset, g, pair, acts, sums) },
            (true, 6) => unsafe { pair_tile_vnni::<6>(w, scale, offset, g, pair, acts, sums) },
            (true, 5) => unsafe { pair_tile_vnni::<5>(w, scale, offset, g, pair, acts, sums) },
            (true, 4) => unsafe { pair_tile_vnni::<4>(w, scale, offset, g, pair, acts, sums) },
            (true, 3) => unsafe { pair_tile_vnni::<3>(w, scale, offset, g, pair, acts, sums) },
            (true, 2) => unsafe { pair_tile_vnni::<2>(w, scale, offset, g, pair, acts, sums) },
            (true, _) => unsafe { pair_tile_vnni::<1>(w, scale, offset, g, pair, acts, sums) },
            (false, 4) => unsafe { tile_factored::<4>(w, scale, offset, g, acts, sums) },
            (false, 3) => unsafe { tile_factored::<3>(w, scale, offset, g, acts, sums) },
            (false, 2) => unsafe { tile_factored::<2>(w, scale, offset, g, acts, sums) },
            (false, _) => unsafe { tile_factored::<1>(w, scale, offset, g, acts, sums) },
        });
    }

    /// `tile` for factored scales (`FactoredLanes`) and Q8_K activations: each block's pair sums
    /// are multiplied by the rows' integer scales in the `madd` that widens them and summed over
    /// the super-block in i32, as llama.cpp's Q4_K dot product does; the units and the
    /// activations' scale multiply once per super-block, and the offsets' integers, in f32, the
    /// blocks' activation sums. Fewer instructions per weight than whole f32 scales, for a
    /// fifth fewer bytes.
    ///
    /// Bounds: 8 pair sums of at most `2 · 15 · 128` stay within i16 (as in `tile`); times an
    /// integer scale of at most 128 in magnitude, twice, and over a super-block's 8 blocks,
    /// within 8 · 2 · 30,720 · 128 < 2^31.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_factored<const T: usize>(
        w: &GroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        g: usize,
        acts: &[ActRow<'_>; TOKENS],
        sums: &mut TileSums,
    ) {
        let blocks = w.cols / ACT_BLOCK;
        let per_unit = scale.layout.per_unit();
        let levels = w.levels.as_ptr().add(g * blocks * GROUP_BLOCK_BYTES);
        let (mask, low16) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi32(0xFFFF));
        let mut acc = [_mm256_setzero_ps(); T];
        for first in (0..blocks).step_by(per_unit) {
            let mut scaled = [_mm256_setzero_si256(); T];
            let mut offsets = [_mm256_setzero_ps(); T];
            for b in first..first + per_unit {
                let block = levels.add(b * GROUP_BLOCK_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES).cast());
                _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES + 64).cast());
                let raw: [__m256i; 4] = std::array::from_fn(|k| _mm256_loadu_si256(block.add(32 * k).cast()));
                let low: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(raw[k], mask));
                let high: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(_mm256_srli_epi16(raw[k], 4), mask));
                let at = (g * blocks + b) * GROUP_ROWS;
                // Row r's integer scale in both i16 halves of lane r.
                let k32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(scale.k.as_ptr().add(at).cast()));
                let k16 = _mm256_or_si256(_mm256_and_si256(k32, low16), _mm256_slli_epi32(k32, 16));
                let m = offset.map(|o| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(o.k.as_ptr().add(at).cast()))));
                for j in 0..T {
                    let q = acts[j].q.as_ptr().add(b * ACT_BLOCK);
                    let mut pairs = _mm256_setzero_si256();
                    for k in 0..4 {
                        let x_low = _mm256_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned());
                        let x_high = _mm256_set1_epi32(q.add(16 + 4 * k).cast::<i32>().read_unaligned());
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low[k], x_low));
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(high[k], x_high));
                    }
                    scaled[j] = _mm256_add_epi32(scaled[j], _mm256_madd_epi16(pairs, k16));
                    if let Some(m) = m {
                        offsets[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(*acts[j].sums32.get_unchecked(b)), offsets[j]);
                    }
                }
            }
            end_super_block(&mut acc, &scaled, &offsets, scale, offset, (g * blocks + first) * GROUP_ROWS, acts, first);
        }
        for j in 0..T {
            _mm256_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
        }
    }

    /// `tile_factored` with AVX512-VNNI's `dpbusd`, which sums each block's 4-byte products
    /// straight into i32 for the integer scales to multiply (`mullo`), for groups g and g + 1 at
    /// once (`pair`; else group g in both halves, and its sums twice), in 512-bit vectors whose
    /// low half holds group g's 8 rows and high half group g + 1's: each 4 activation bytes are
    /// broadcast once for 16 rows, where the 256-bit tile broadcasts them for 8. A broadcast
    /// operand costs the same as the `dpbusd` it feeds on Zen 4 (the 256-bit tile runs at about
    /// 1.1 `dpbusd` a cycle of the 2 the core can start), and a 512-bit `dpbusd` does the work
    /// of two 256-bit ones (two passes on Zen 4, one on Intel's 512-bit units). Bounds: a block's
    /// 32 products of at most 15 · 128, times an integer scale of at most 128, over 8 blocks,
    /// within 2^31.
    ///
    /// # Safety
    /// As `factored_products`'s with `vnni`, and group g (and g + 1 where `pair`) is within `w`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair_tile_vnni<const T: usize>(
        w: &GroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        g: usize,
        pair: bool,
        acts: &[ActRow<'_>; TOKENS],
        sums: &mut TileSums,
    ) {
        let blocks = w.cols / ACT_BLOCK;
        let per_unit = scale.layout.per_unit();
        let levels = w.levels.as_ptr().add(g * blocks * GROUP_BLOCK_BYTES);
        // The high half's blocks, and its scales', offsets' and units' lanes, are the low half's
        // moved by `next` and `next_lanes`: group g + 1's, or group g's own.
        let groups = usize::from(pair);
        let (next, next_lanes) = (groups * blocks * GROUP_BLOCK_BYTES, groups * blocks * GROUP_ROWS);
        // A pair's two 8-lane runs at `at` and `at + next_lanes`: one as 16 i32 lanes, the other
        // as 16 f32 lanes.
        let ints = |k: &[i8], at: usize| {
            let two =
                _mm_unpacklo_epi64(_mm_loadl_epi64(k.as_ptr().add(at).cast()), _mm_loadl_epi64(k.as_ptr().add(at + next_lanes).cast()));
            _mm512_cvtepi8_epi32(two)
        };
        // (The f32 halves are joined as integers: AVX512F inserts 256-bit halves of 64-bit lanes
        // only, and 32-bit ones need AVX512DQ.)
        let units = |lanes: FactoredLanes<'_>, at: usize| {
            let half = |at: usize| _mm256_castps_si256(_mm256_loadu_ps(lanes.units.as_ptr().add(lanes.layout.unit_of(at))));
            _mm512_castsi512_ps(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(at)), half(at + next_lanes)))
        };
        let mask = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); T];
        for first in (0..blocks).step_by(per_unit) {
            let mut scaled = [_mm512_setzero_si512(); T];
            let mut offsets = [_mm512_setzero_ps(); T];
            for b in first..first + per_unit {
                let block = levels.add(b * GROUP_BLOCK_BYTES);
                for ahead in [PREFETCH_BYTES, PREFETCH_BYTES + 64, next + PREFETCH_BYTES, next + PREFETCH_BYTES + 64] {
                    _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(ahead).cast());
                }
                let raw: [__m512i; 4] = std::array::from_fn(|k| {
                    let low = _mm256_loadu_si256(block.add(32 * k).cast());
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), _mm256_loadu_si256(block.add(next + 32 * k).cast()))
                });
                let low: [__m512i; 4] = std::array::from_fn(|k| _mm512_and_si512(raw[k], mask));
                let high: [__m512i; 4] = std::array::from_fn(|k| _mm512_and_si512(_mm512_srli_epi16::<4>(raw[k]), mask));
                let at = (g * blocks + b) * GROUP_ROWS;
                let k32 = ints(scale.k, at);
                let m = offset.map(|o| _mm512_cvtepi32_ps(ints(o.k, at)));
                for j in 0..T {
                    let q = acts[j].q.as_ptr().add(b * ACT_BLOCK);
                    let mut block_sums = _mm512_setzero_si512();
                    for k in 0..4 {
                        let x_low = _mm512_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned());
                        let x_high = _mm512_set1_epi32(q.add(16 + 4 * k).cast::<i32>().read_unaligned());
                        block_sums = _mm512_dpbusd_epi32(block_sums, low[k], x_low);
                        block_sums = _mm512_dpbusd_epi32(block_sums, high[k], x_high);
                    }
                    scaled[j] = _mm512_add_epi32(scaled[j], _mm512_mullo_epi32(block_sums, k32));
                    if let Some(m) = m {
                        offsets[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(*acts[j].sums32.get_unchecked(b)), offsets[j]);
                    }
                }
            }
            // As `end_super_block`: the units and the activations' scale once a super-block.
            let at = (g * blocks + first) * GROUP_ROWS;
            let unit = units(scale, at);
            let offset_unit = offset.map(|o| units(o, at));
            for j in 0..T {
                let d = _mm512_set1_ps(*acts[j].d.get_unchecked(first));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[j]), _mm512_mul_ps(unit, d), acc[j]);
                if let Some(u) = offset_unit {
                    acc[j] = _mm512_fmadd_ps(offsets[j], u, acc[j]);
                }
            }
        }
        for j in 0..T {
            _mm512_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
        }
    }

    /// Group g's 8 rows times the first `T` of `acts`, into `sums[token][row]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const T: usize, S: EightScales>(
        w: &GroupRows<'_>,
        scale: S,
        offset: Option<S>,
        g: usize,
        acts: &[ActRow<'_>; TOKENS],
        sums: &mut TileSums,
    ) {
        let blocks = w.cols / ACT_BLOCK;
        let levels = w.levels.as_ptr().add(g * blocks * GROUP_BLOCK_BYTES);
        let (mask, ones, minus_bias) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1), _mm256_set1_ps(-w.bias));
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..blocks {
            let block = levels.add(b * GROUP_BLOCK_BYTES);
            _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES).cast());
            _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES + 64).cast());
            let raw: [__m256i; 4] = std::array::from_fn(|k| _mm256_loadu_si256(block.add(32 * k).cast()));
            let low: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(raw[k], mask));
            let high: [__m256i; 4] = std::array::from_fn(|k| _mm256_and_si256(_mm256_srli_epi16(raw[k], 4), mask));
            let at = (g * blocks + b) * GROUP_ROWS;
            let scale = scale.eight(at);
            let offset = offset.map(|o| o.eight(at));
            for j in 0..T {
                let q = acts[j].q.as_ptr().add(b * ACT_BLOCK);
                // Each maddubs lane pair is at most 2 · 15 · 128 apart from zero, so the 8 of
                // them add up in i16 without overflow; then one madd makes the rows' i32 sums.
                let mut pairs = _mm256_setzero_si256();
                for k in 0..4 {
                    let x_low = _mm256_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned());
                    let x_high = _mm256_set1_epi32(q.add(16 + 4 * k).cast::<i32>().read_unaligned());
                    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low[k], x_low));
                    pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(high[k], x_high));
                }
                let block_sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                let d = _mm256_set1_ps(*acts[j].d.get_unchecked(b));
                let x_sum = _mm256_set1_ps(*acts[j].sums32.get_unchecked(b));
                // scale · (d · Σ level·q - bias · d · Σ q): the bias's term in the same FMA.
                let unbiased = _mm256_fmadd_ps(block_sums, d, _mm256_mul_ps(minus_bias, x_sum));
                acc[j] = _mm256_fmadd_ps(unbiased, scale, acc[j]);
                if let Some(offset) = offset {
                    acc[j] = _mm256_fmadd_ps(offset, x_sum, acc[j]);
                }
            }
        }
        for j in 0..T {
            _mm256_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::activations::{ActFormat, Q8K_BLOCK};
    use crate::dot::{int_products, IntRows, Levels};
    use crate::factored::{test_factors, UnitLayout};

    /// The interleaved products give the row-by-row kernels' sums for the same weights (up to
    /// the order of the f32 additions), with f32 and f16 scales, with and without offsets, for
    /// tiles of every width (1 to 8 tokens) and a run of whole tiles with a remainder; the SIMD
    /// code gives the portable code's.
    #[test]
    fn interleaved_products_are_the_row_layouts() {
        let (rows, cols) = (24, 256);
        let blocks = cols / ACT_BLOCK;
        let nibbles: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 53 % 251) as u8).collect();
        let woven = interleave_levels(&nibbles, rows, cols);
        assert_eq!(deinterleave_levels(&woven, rows, cols), nibbles);
        // Exact in f16, so both storages give the same sums.
        let scale: Vec<f32> = (0..rows * blocks).map(|g| (1 + g % 11) as f32 / 256.0).collect();
        let offset: Vec<f32> = (0..rows * blocks).map(|g| -((g % 13) as f32) / 64.0).collect();
        let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let (scale_w, offset_w) = (interleave_values(&scale, rows, blocks, false), interleave_values(&offset, rows, blocks, false));
        assert_eq!(interleave_values(&scale_w, rows, blocks, true), scale);
        let (scale16, offset16, scale16_w, offset16_w) = (to_f16(&scale), to_f16(&offset), to_f16(&scale_w), to_f16(&offset_w));
        let x: Vec<f32> = (0..19 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
        let stores = [
            (Scales::F32(&scale), Scales::F32(&offset), Scales::F32(&scale_w), Scales::F32(&offset_w)),
            (Scales::F16(&scale16), Scales::F16(&offset16), Scales::F16(&scale16_w), Scales::F16(&offset16_w)),
        ];
        for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| [1, 2, 3, 4, 5, 6, 7, 19].map(|n| (f, n))) {
            let xq = QuantizedRows::new(&x[..n * cols], format);
            for (with_offset, (s, o, s_w, o_w)) in [false, true].into_iter().flat_map(|o| stores.map(|s| (o, s))) {
                let plain =
                    IntRows { levels: Levels::Nibbles(&nibbles), group: ACT_BLOCK, scale: s, offset: with_offset.then_some(o), cols };
                let w = GroupRows { levels: &woven, scale: s_w, offset: with_offset.then_some(o_w), bias: 0.0, cols };
                check(w, plain, &xq, &format!("{format:?} n {n} offset {with_offset}"));
            }
            // Q4_0's bias, against the row layout's offsets of -8 · scale.
            for (s, s_w) in [(Scales::F32(&scale), Scales::F32(&scale_w)), (Scales::F16(&scale16), Scales::F16(&scale16_w))] {
                let minus8: Vec<f32> = (0..scale.len()).map(|i| -8.0 * s.get(i)).collect();
                let plain =
                    IntRows { levels: Levels::Nibbles(&nibbles), group: ACT_BLOCK, scale: s, offset: Some(Scales::F32(&minus8)), cols };
                let w = GroupRows { levels: &woven, scale: s_w, offset: None, bias: 8.0, cols };
                check(w, plain, &xq, &format!("{format:?} n {n} bias 8"));
            }
            // K-quant scales and offsets kept factored (the i32 super-block tile with Q8_K
            // activations), integers over i8's whole range.
            let per_unit = Q8K_BLOCK / ACT_BLOCK;
            let (scale, units, k) = test_factors(rows, blocks, per_unit, 1);
            let (offset, offset_units, offset_k) = test_factors(rows, blocks, per_unit, 2);
            let layout = UnitLayout::new(per_unit, GROUP_ROWS);
            for with_offset in [false, true] {
                let plain = IntRows {
                    levels: Levels::Nibbles(&nibbles),
                    group: ACT_BLOCK,
                    scale: Scales::F32(&scale),
                    offset: with_offset.then_some(Scales::F32(&offset)),
                    cols,
                };
                let o_w = with_offset.then_some(Scales::Factored { units: &offset_units, k: &offset_k, layout });
                let w =
                    GroupRows { levels: &woven, scale: Scales::Factored { units: &units, k: &k, layout }, offset: o_w, bias: 0.0, cols };
                check(w, plain, &xq, &format!("factored {format:?} n {n} offset {with_offset}"));
            }
        }
    }

    /// The SIMD and the portable interleaved products of `w` give the row kernels' of `plain`
    /// (the same weights), up to the order of the f32 additions.
    fn check(w: GroupRows<'_>, plain: IntRows<'_>, xq: &QuantizedRows, what: &str) {
        let (rows, n) = (w.rows(), xq.rows(w.cols));
        #[cfg(target_arch = "x86_64")]
        let factored = crate::dot::avx2::FactoredLanes::super_blocks(w.scale, w.offset, ACT_BLOCK, w.cols, xq).map(|(scale, offset)| {
            // SAFETY: `check_products` runs only the instruction sets present, on these shapes.
            move |vnni: bool, out: &mut [f32]| unsafe { avx2::factored_products(&w, scale, offset, xq, out, rows, n, vnni) }
        });
        #[cfg(not(target_arch = "x86_64"))]
        let factored = None::<fn(bool, &mut [f32])>;
        check_products(
            rows * n,
            what,
            &|out| int_products(plain, xq, out),
            &|out| products(w, xq, out),
            &|out| products_portable(w, xq, out, rows, n),
            factored.as_ref().map(|f| f as &FactoredRun<'_>),
        );
    }

    /// The factored tiles of a case, with `dpbusd` or without: `(vnni, out)`.
    pub(crate) type FactoredRun<'a> = dyn Fn(bool, &mut [f32]) + 'a;

    /// One case of the interleaved tests: the products `products` chooses (`chosen`) and the
    /// portable ones against the row kernels' (`want`), up to the order of the f32 additions; and,
    /// where the case has factored tiles (`factored(vnni, out)`), each instruction set of them
    /// this machine has against the portable ones.
    pub(crate) fn check_products(
        len: usize,
        what: &str,
        want: &dyn Fn(&mut [f32]),
        chosen: &dyn Fn(&mut [f32]),
        portable: &dyn Fn(&mut [f32]),
        factored: Option<&FactoredRun<'_>>,
    ) {
        let run = |f: &dyn Fn(&mut [f32])| {
            let mut out = vec![0f32; len];
            f(&mut out);
            out
        };
        let close = |got: &[f32], reference: &[f32], which: &str| {
            for (i, (g, r)) in got.iter().zip(reference).enumerate() {
                assert!((g - r).abs() <= 1e-4 * r.abs().max(1.0), "{what} {which} [{i}]: {g} vs {r}");
            }
        };
        let (want, portable) = (run(want), run(portable));
        close(&run(chosen), &want, "chosen");
        close(&portable, &want, "portable");
        #[cfg(target_arch = "x86_64")]
        if let Some(factored) = factored {
            let sets = [(has_simd(), false), (has_simd() && crate::dot::avx2::has_avx512_vnni(), true)];
            for (_, vnni) in sets.into_iter().filter(|&(present, _)| present) {
                close(&run(&|out| factored(vnni, out)), &portable, &format!("factored, vnni {vnni}"));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = factored;
    }
}
