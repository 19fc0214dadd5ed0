//! Weight rows of byte levels (Q8_0, Q5_0, Q5_1, Q5_K) and of 6-bit levels (Q6_K) in groups of
//! 8, interleaved as `interleaved` does the 4-bit ones: one 32-byte chunk holds 4 levels of each
//! of the 8 rows, and a `maddubs` of it with 4 activation bytes broadcast to every lane sums 4
//! weights of all 8 rows at once; a block's 8 such chunks end as one vector of the 8 rows' integer
//! sums (two for Q6_K's groups of 16), converted, scaled and accumulated once for the 8 rows.
//!
//! Byte layout (`cols` weights a row, `blocks = cols / 32`): level `m` of chunk `k` (0..8) of row
//! `i` (0..8) of row group `g`, block `b`, sits at `((g · blocks + b) · 8 + k) · 32 + 4 · i + m`,
//! and is level `4k + m` of that row's block.
//!
//! Six-bit layout (Q6_K, whose levels are -32..31): a group's block is 192 bytes instead of 256, a
//! quarter less for a decode step to stream. Each level is kept as `level + 32` (0..63): its low 4
//! bits in the first 128 bytes, in `interleaved`'s nibble layout (chunk `k`'s in the low nibbles of
//! bytes `32 · (k % 4)..`, in the high ones for `k ≥ 4`), its high 2 bits in the last 64 (chunk
//! `k`'s at bits `2 · (k % 4)` of bytes `128 + 32 · (k / 4)..`), each at `4 · i + m` of its 32. The
//! tiles rebuild a chunk with a few shifts and masks, multiply the unsigned values, and take
//! `32 · Σ x` off each 16 weights' sum in integers.
//!
//! Scales and offsets, one per group of 16 or 32 weights, are interleaved as
//! `interleaved::value_index` says, with the groups of a row for its blocks.

use crate::activations::QuantizedRows;
use crate::dot::Scales;
use crate::interleaved::{value_index, GROUP_ROWS};
use crate::ACT_BLOCK;

/// What a 6-bit level is kept above the format's.
pub(crate) const SIX_BIT_BIAS: i8 = 32;
// `put_six_bit_block` adds it as an XOR of bit 5, and the factored tiles take it off as a shift
// by 5.
const _: () = assert!(SIX_BIT_BIAS == 1 << 5);
/// Bytes of one group's block of 6-bit levels: 8 rows of 32, 4 + 2 bits each.
pub(crate) const SIX_BIT_BLOCK_BYTES: usize = GROUP_ROWS * ACT_BLOCK * 6 / 8;
/// Where a group's block of 6-bit levels keeps their high 2 bits.
const SIX_BIT_HIGH: usize = GROUP_ROWS * ACT_BLOCK / 2;

/// Where level `e` (0..32) of row `r`'s block `b` lies in the interleaved levels.
#[inline]
pub(crate) fn level_index(r: usize, b: usize, e: usize, blocks: usize) -> usize {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    ((g * blocks + b) * 8 + e / 4) * 32 + 4 * i + e % 4
}

/// Where the 6-bit level `e` (0..32) of row `r`'s block `b` keeps its low 4 bits and its high 2:
/// `[(byte, shift); 2]`.
#[inline]
pub(crate) fn six_bit_places(r: usize, b: usize, e: usize, blocks: usize) -> [(usize, u32); 2] {
    let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
    let (k, m) = (e / 4, e % 4);
    let block = (g * blocks + b) * SIX_BIT_BLOCK_BYTES + 4 * i + m;
    [(block + 32 * (k % 4), 4 * (k / 4) as u32), (block + SIX_BIT_HIGH + 32 * (k / 4), 2 * (k % 4) as u32)]
}

/// Stores row `r`'s block `b` of 32 levels (-32..31, `block`) at their places in 6-bit levels:
/// each of the row's 4-byte runs of the group's block (`six_bit_places`) written whole, once.
#[inline]
pub(crate) fn put_six_bit_block(levels: &mut [u8], r: usize, b: usize, blocks: usize, block: &[i8]) {
    // Chunk k's 4 kept values, a byte each: 8 at a time, as `(level & 63) ^ 32`, which is
    // `level + 32` for -32..31 without a carry between bytes.
    let eight = |w: usize| {
        let bytes = block.get(8 * w..8 * w + 8).and_then(|b| <[i8; 8]>::try_from(b).ok()).unwrap_or_default();
        u64::from_le_bytes(bytes.map(|v| v as u8)) & 0x3F3F_3F3F_3F3F_3F3F ^ 0x2020_2020_2020_2020
    };
    let words = [eight(0), eight(1), eight(2), eight(3)];
    let kept: [u32; 8] = std::array::from_fn(|k| (words[k / 2] >> (32 * (k % 2))) as u32);
    let mut put = |at: usize, bits: u32| levels[at..at + 4].copy_from_slice(&bits.to_le_bytes());
    let [(low, _), (high, _)] = six_bit_places(r, b, 0, blocks);
    for k in 0..4 {
        put(low + 32 * k, kept[k] & 0x0F0F_0F0F | (kept[k + 4] & 0x0F0F_0F0F) << 4);
    }
    for half in 0..2 {
        let twos = (0..4).fold(0, |bits, s| bits | (kept[4 * half + s] >> 4 & 0x0303_0303) << (2 * s));
        put(high + 32 * half, twos);
    }
}

/// How a group's blocks keep their levels.
#[derive(Clone, Copy)]
pub(crate) enum WovenLevels<'a> {
    /// A byte a level (`level_index`).
    Bytes(&'a [i8]),
    /// Six bits a level (`six_bit_places`).
    SixBits(&'a [u8]),
}

impl WovenLevels<'_> {
    /// Level `e` of row `r`'s block `b`, as the format has it.
    pub(crate) fn level(&self, r: usize, b: usize, e: usize, blocks: usize) -> i8 {
        match self {
            WovenLevels::Bytes(q) => q[level_index(r, b, e, blocks)],
            WovenLevels::SixBits(bits) => {
                let [(low, low_shift), (high, high_shift)] = six_bit_places(r, b, e, blocks);
                let kept = (bits[low] >> low_shift) & 0x0F | ((bits[high] >> high_shift) & 0x03) << 4;
                kept as i8 - SIX_BIT_BIAS
            }
        }
    }

    /// Weights they hold.
    fn len(&self) -> usize {
        match self {
            WovenLevels::Bytes(q) => q.len(),
            WovenLevels::SixBits(bits) => bits.len() / 3 * 4,
        }
    }

    /// Bytes of one group's block (8 rows of 32 levels).
    pub(crate) fn block_bytes(&self) -> usize {
        match self {
            WovenLevels::Bytes(_) => GROUP_ROWS * ACT_BLOCK,
            WovenLevels::SixBits(_) => SIX_BIT_BLOCK_BYTES,
        }
    }

    /// The levels' first byte (for the x86-64 tiles, which walk the blocks by pointer).
    #[cfg(target_arch = "x86_64")]
    fn start(&self) -> *const u8 {
        match self {
            WovenLevels::Bytes(q) => q.as_ptr().cast(),
            WovenLevels::SixBits(bits) => bits.as_ptr(),
        }
    }

    /// Whether they are whole groups' blocks of `cols` weights a row.
    fn whole(&self, cols: usize) -> bool {
        let bytes = match self {
            WovenLevels::Bytes(q) => q.len(),
            WovenLevels::SixBits(bits) => bits.len(),
        };
        bytes.is_multiple_of(self.block_bytes() * (cols / ACT_BLOCK).max(1))
    }
}

/// The interleaved levels back one row after another.
pub(crate) fn deinterleave_levels(levels: WovenLevels<'_>, rows: usize, cols: usize) -> Vec<i8> {
    let blocks = cols / ACT_BLOCK;
    let mut out = vec![0i8; levels.len()];
    for r in 0..rows {
        for b in 0..blocks {
            for e in 0..ACT_BLOCK {
                out[(r * blocks + b) * ACT_BLOCK + e] = levels.level(r, b, e, blocks);
            }
        }
    }
    out
}

/// Consecutive whole groups of interleaved rows: their levels, scales and offsets, a scale per
/// `group` (16 or 32) weights; `w = scale · level + offset`.
#[derive(Clone, Copy)]
pub(crate) struct ByteGroupRows<'a> {
    pub levels: WovenLevels<'a>,
    pub group: usize,
    pub scale: Scales<'a>,
    pub offset: Option<Scales<'a>>,
    pub cols: usize,
}

impl ByteGroupRows<'_> {
    fn rows(&self) -> usize {
        self.levels.len() / self.cols
    }
}

/// `out[r·n + t] = Σ_e w_r[e]·x_t[e]` for the rows of `w` and the `n` rows of `x`.
pub(crate) fn products(w: ByteGroupRows<'_>, x: &QuantizedRows, out: &mut [f32]) {
    let (rows, n) = (w.rows(), x.rows(w.cols));
    assert!(
        w.cols.is_multiple_of(ACT_BLOCK)
            && matches!(w.group, 16 | 32)
            && w.levels.whole(w.cols)
            && rows.is_multiple_of(GROUP_ROWS)
            && w.scale.len() * w.group == rows * w.cols
            && w.offset.is_none_or(|o| o.len() == w.scale.len() && w.group == ACT_BLOCK)
            && out.len() == rows * n
            && x.d.len() * ACT_BLOCK == x.q.len(),
        "interleaved byte products: shapes differ"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::interleaved::has_simd() {
        // SAFETY: AVX2, FMA and F16C are present; the shapes were checked above, and every load
        // reads within the group's levels and scales and a token's activation row.
        unsafe { avx2::products(w, x, out, rows, n) };
        return;
    }
    products_portable(w, x, out, rows, n);
}

/// The products one weight at a time: the reference the SIMD code is tested against.
pub(crate) fn products_portable(w: ByteGroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
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
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::{ByteGroupRows, WovenLevels, GROUP_ROWS, SIX_BIT_BIAS, SIX_BIT_HIGH};
    use crate::activations::QuantizedRows;
    use crate::activations::Q8K_BLOCK;
    use crate::dot::avx2::{end_super_block, has_avx512_vnni, with_eight_scales, EightScales, FactoredLanes};
    use crate::dot::ActRow;
    use crate::interleaved::avx2::{by_tiles, factored_tile_tokens, TileSums, PREFETCH_BYTES, TILE_TOKENS, TOKENS};
    use crate::ACT_BLOCK;

    /// # Safety
    /// AVX2, FMA and F16C are present, and `w`, `x` and `out` have the shapes `products` checks.
    pub(super) unsafe fn products(w: ByteGroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize) {
        if let Some((scale, offset)) = FactoredLanes::super_blocks(w.scale, w.offset, w.group, w.cols, x) {
            factored_products(&w, scale, offset, x, out, rows, n, has_avx512_vnni());
            return;
        }
        let six = matches!(w.levels, WovenLevels::SixBits(_));
        with_eight_scales!(w.scale, w.offset, |s, o| match (w.group == ACT_BLOCK, six) {
            // SAFETY: as this function's.
            (true, false) => unsafe { tiles::<false, false, _>(&w, s, o, x, out, rows, n) },
            (true, true) => unsafe { tiles::<false, true, _>(&w, s, o, x, out, rows, n) },
            (false, false) => unsafe { tiles::<true, false, _>(&w, s, o, x, out, rows, n) },
            (false, true) => unsafe { tiles::<true, true, _>(&w, s, o, x, out, rows, n) },
        });
    }

    /// `products` by `tile`s of the layout and the scale per 16 (`HALVES`) that `w` has.
    ///
    /// # Safety
    /// As `products`'s, and `SIX` says whether `w`'s levels are 6-bit.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tiles<const HALVES: bool, const SIX: bool, S: EightScales>(
        w: &ByteGroupRows<'_>,
        s: S,
        o: Option<S>,
        x: &QuantizedRows,
        out: &mut [f32],
        rows: usize,
        n: usize,
    ) {
        by_tiles(x, w.cols, rows, n, out, TILE_TOKENS, false, |g, _, acts, tokens, sums| match tokens {
            // SAFETY: as this function's.
            4 => unsafe { tile::<4, HALVES, SIX, _>(w, s, o, g, acts, sums) },
            3 => unsafe { tile::<3, HALVES, SIX, _>(w, s, o, g, acts, sums) },
            2 => unsafe { tile::<2, HALVES, SIX, _>(w, s, o, g, acts, sums) },
            _ => unsafe { tile::<1, HALVES, SIX, _>(w, s, o, g, acts, sums) },
        })
    }

    /// `products` of factored scales with Q8_K activations (`FactoredLanes::super_blocks`), with
    /// AVX512-VNNI's `dpbusd` where `vnni`.
    ///
    /// # Safety
    /// As `products`'s, the layout checked by `super_blocks`, and AVX512-VNNI and AVX512VL
    /// present where `vnni`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn factored_products(
        w: &ByteGroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        x: &QuantizedRows,
        out: &mut [f32],
        rows: usize,
        n: usize,
        vnni: bool,
    ) {
        let six = matches!(w.levels, WovenLevels::SixBits(_));
        // SAFETY: as this function's.
        unsafe {
            match (w.group != ACT_BLOCK, six) {
                (false, false) => factored_tiles::<false, false>(w, scale, offset, x, out, rows, n, vnni),
                (false, true) => factored_tiles::<false, true>(w, scale, offset, x, out, rows, n, vnni),
                (true, false) => factored_tiles::<true, false>(w, scale, offset, x, out, rows, n, vnni),
                (true, true) => factored_tiles::<true, true>(w, scale, offset, x, out, rows, n, vnni),
            }
        }
    }

    /// `factored_products` by the factored tiles of `HALVES` and `SIX`.
    ///
    /// # Safety
    /// As `factored_products`'s, and `SIX` says whether `w`'s levels are 6-bit.
    #[allow(clippy::too_many_arguments)]
    unsafe fn factored_tiles<const HALVES: bool, const SIX: bool>(
        w: &ByteGroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        x: &QuantizedRows,
        out: &mut [f32],
        rows: usize,
        n: usize,
        vnni: bool,
    ) {
        by_tiles(x, w.cols, rows, n, out, factored_tile_tokens(vnni), false, |g, _, acts, tokens, sums| {
            // SAFETY: as this function's.
            unsafe {
                match (vnni, tokens) {
                    (false, 4) => tile_factored::<4, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (false, 3) => tile_factored::<3, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (false, 2) => tile_factored::<2, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (false, _) => tile_factored::<1, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 8) => tile_factored_vnni::<8, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 7) => tile_factored_vnni::<7, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 6) => tile_factored_vnni::<6, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 5) => tile_factored_vnni::<5, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 4) => tile_factored_vnni::<4, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 3) => tile_factored_vnni::<3, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, 2) => tile_factored_vnni::<2, HALVES, SIX>(w, scale, offset, g, acts, sums),
                    (true, _) => tile_factored_vnni::<1, HALVES, SIX>(w, scale, offset, g, acts, sums),
                }
            }
        });
    }

    /// Writes `factored_tile` compiled for one instruction set: `tile_factored` (AVX2) and
    /// `tile_factored_vnni` (AVX512-VNNI's `dpbusd` on 256-bit vectors) differ only in the
    /// features they enable.
    macro_rules! factored_tile_for {
        ($name:ident, $features:literal, $vnni:literal) => {
            /// `factored_tile` compiled for the instruction sets it is named by.
            #[target_feature(enable = $features)]
            unsafe fn $name<const T: usize, const HALVES: bool, const SIX: bool>(
                w: &ByteGroupRows<'_>,
                scale: FactoredLanes<'_>,
                offset: Option<FactoredLanes<'_>>,
                g: usize,
                acts: &[ActRow<'_>; TOKENS],
                sums: &mut TileSums,
            ) {
                factored_tile::<T, HALVES, SIX, $vnni>(w, scale, offset, g, acts, sums)
            }
        };
    }

    factored_tile_for!(tile_factored, "avx2,fma,f16c", false);
    factored_tile_for!(tile_factored_vnni, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", true);

    /// Group g's first block and the bytes of each of its blocks.
    ///
    /// # Safety
    /// Group g is within `w`'s levels.
    #[inline(always)]
    unsafe fn group_blocks(w: &ByteGroupRows<'_>, g: usize, blocks: usize) -> (*const u8, usize) {
        let block_bytes = w.levels.block_bytes();
        (w.levels.start().add(g * blocks * block_bytes), block_bytes)
    }

    /// Fetches a block's bytes `PREFETCH_BYTES` ahead into the cache.
    #[inline(always)]
    unsafe fn prefetch_ahead(block: *const u8, block_bytes: usize) {
        for line in 0..block_bytes / 64 {
            _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES + 64 * line).cast());
        }
    }

    /// Chunk `k` (0..8) of a group's block at `block`: levels `4k..4k + 4` of each of the 8 rows,
    /// the signed byte levels as they are, or (`SIX`) the 6-bit values kept, `level + 32`, put
    /// back together from their low 4 bits and high 2.
    ///
    /// # Safety
    /// AVX2 is present (inlined into callers that enable it), and the block is whole.
    #[inline(always)]
    unsafe fn chunk<const SIX: bool>(block: *const u8, k: usize) -> __m256i {
        if !SIX {
            return _mm256_loadu_si256(block.add(32 * k).cast());
        }
        let low4 = _mm256_set1_epi8(0x0F);
        let nibbles = _mm256_loadu_si256(block.add(32 * (k % 4)).cast());
        let low = if k < 4 { nibbles } else { _mm256_srli_epi16::<4>(nibbles) };
        let twos = _mm256_loadu_si256(block.add(SIX_BIT_HIGH + 32 * (k / 4)).cast());
        // Bits 2 (k % 4) and 2 (k % 4) + 1 of each byte to bits 4 and 5; the shifts are of 16-bit
        // lanes, and the mask keeps only what came from the byte itself.
        let high = match k % 4 {
            0 => _mm256_slli_epi16::<4>(twos),
            1 => _mm256_slli_epi16::<2>(twos),
            2 => twos,
            _ => _mm256_srli_epi16::<2>(twos),
        };
        _mm256_or_si256(_mm256_and_si256(low, low4), _mm256_and_si256(high, _mm256_set1_epi8(0x30)))
    }

    /// The two operands of a chunk's `maddubs` or `dpbusd` (unsigned bytes times signed): the
    /// levels' magnitudes and x with their signs, or (`SIX`) the kept values and x as it is.
    #[inline(always)]
    unsafe fn operands<const SIX: bool>(levels: __m256i, x: __m256i) -> (__m256i, __m256i) {
        if SIX {
            (levels, x)
        } else {
            (_mm256_sign_epi8(levels, levels), _mm256_sign_epi8(x, levels))
        }
    }

    /// Activation bytes `4k..4k + 4` of block `b` of `act`, in every lane: what chunk `k` of a
    /// group's block multiplies.
    #[inline(always)]
    unsafe fn x_chunk(act: &ActRow<'_>, b: usize, k: usize) -> __m256i {
        _mm256_set1_epi32(act.q.as_ptr().add(b * ACT_BLOCK + 4 * k).cast::<i32>().read_unaligned())
    }

    /// What 6-bit levels' bias adds to the sum of 16 weights times x: `32 · Σ x` of those 16
    /// (`level_sums16`), in every lane.
    #[inline(always)]
    unsafe fn six_bit_bias(act: &ActRow<'_>, sixteen: usize) -> __m256i {
        _mm256_set1_epi32(i32::from(SIX_BIT_BIAS) * i32::from(*act.level_sums16.get_unchecked(sixteen)))
    }

    /// `tile` for factored scales (`FactoredLanes`) and Q8_K activations (Q5_K, Q6_K): each
    /// chunk's pair sums are multiplied by the rows' integer scales in the `madd` that widens
    /// them and summed over the super-block in i32, as llama.cpp's K-quant dot products do; the
    /// units and the activations' scale multiply once per super-block, and the offsets' integers,
    /// in f32, the blocks' activation sums. 6-bit levels (`SIX`) take their bias, `32 · Σ x`
    /// times each 16 weights' integer scale, off the scaled sums once a block.
    ///
    /// Bounds: a pair sum is at most `2 · 128 · 127` in magnitude (any byte levels; a 6-bit
    /// value's, `2 · 63 · 128`); times an integer scale of at most 128, twice, over 8 chunks a
    /// block and 8 blocks a super-block, within 64 · 2 · 32,512 · 128 < 2^31. With `VNNI`,
    /// `dpbusd` sums each span's products (16 or 32 weights) straight into i32 (at most
    /// 32 · 128 · 128), which the integer scales multiply (`mullo`): the same bound. 6-bit
    /// values' scaled sums stay within 16 · 16 · 63 · 128 · 128 < 2^28 a super-block, and their
    /// bias within 16 · 32 · 16 · 128 · 128 = 2^27, so any partial sum within 2^29.
    ///
    /// Inlined into its callers, which enable the instruction sets it uses.
    #[inline(always)]
    unsafe fn factored_tile<const T: usize, const HALVES: bool, const SIX: bool, const VNNI: bool>(
        w: &ByteGroupRows<'_>,
        scale: FactoredLanes<'_>,
        offset: Option<FactoredLanes<'_>>,
        g: usize,
        acts: &[ActRow<'_>; TOKENS],
        sums: &mut TileSums,
    ) {
        let (blocks, groups) = (w.cols / ACT_BLOCK, w.cols / w.group);
        let super_blocks = Q8K_BLOCK / ACT_BLOCK;
        let (levels, block_bytes) = group_blocks(w, g, blocks);
        let low16 = _mm256_set1_epi32(0xFFFF);
        // Row r's integer scale of value i, as i32 in lane r.
        let scales32 = |i: usize| _mm256_cvtepi8_epi32(_mm_loadl_epi64(scale.k.as_ptr().add(i).cast()));
        // Two i32 lanes' low halves as one lane's two i16.
        let pair16 = |low: __m256i, high: __m256i| _mm256_or_si256(_mm256_and_si256(low, low16), _mm256_slli_epi32(high, 16));
        let mut acc = [_mm256_setzero_ps(); T];
        for first in (0..blocks).step_by(super_blocks) {
            let mut scaled = [_mm256_setzero_si256(); T];
            let mut offsets = [_mm256_setzero_ps(); T];
            for b in first..first + super_blocks {
                let block = levels.add(b * block_bytes);
                prefetch_ahead(block, block_bytes);
                // The block's spans of one integer scale: its halves of 16 weights (`HALVES`),
                // or the whole block. With `VNNI` each token's products over a span sum in one
                // i32 register, so a tile of 8 tokens holds 8 of them, not 16.
                let parts = if HALVES { 2 } else { 1 };
                // The integer scales of the block's first and second 16 weights (one for both
                // where a scale covers 32).
                let k_first = scales32((g * groups + parts * b) * GROUP_ROWS);
                let k = [k_first, if HALVES { scales32((g * groups + parts * b + 1) * GROUP_ROWS) } else { k_first }];
                for (h, &k_h) in k.iter().enumerate().take(parts) {
                    // As `mullo` takes it with `VNNI`, else in both i16 halves for `madd`.
                    let k_span = if VNNI { k_h } else { pair16(k_h, k_h) };
                    let mut span = [_mm256_setzero_si256(); T];
                    for c in h * 8 / parts..(h + 1) * 8 / parts {
                        let levels = chunk::<SIX>(block, c);
                        for j in 0..T {
                            let (w_bytes, x_bytes) = operands::<SIX>(levels, x_chunk(&acts[j], b, c));
                            if VNNI {
                                span[j] = _mm256_dpbusd_epi32(span[j], w_bytes, x_bytes);
                            } else {
                                let pairs = _mm256_maddubs_epi16(w_bytes, x_bytes);
                                scaled[j] = _mm256_add_epi32(scaled[j], _mm256_madd_epi16(pairs, k_span));
                            }
                        }
                    }
                    if VNNI {
                        for j in 0..T {
                            scaled[j] = _mm256_add_epi32(scaled[j], _mm256_mullo_epi32(span[j], k_span));
                        }
                    }
                }
                if SIX {
                    // The bias, 32 · Σ x · k over each 16 weights, off the scaled sums in one
                    // `madd` (`dpwssd`) a token: lane r's -32 · k of its two 16s (at most 4,096
                    // in magnitude) times the token's two sums of 16 levels (`level_sums16`).
                    let bias_k = pair16(
                        _mm256_slli_epi32::<5>(_mm256_sub_epi32(_mm256_setzero_si256(), k[0])),
                        _mm256_slli_epi32::<5>(_mm256_sub_epi32(_mm256_setzero_si256(), k[1])),
                    );
                    for j in 0..T {
                        let x_sums = _mm256_set1_epi32(acts[j].level_sums16.as_ptr().add(2 * b).cast::<i32>().read_unaligned());
                        scaled[j] = if VNNI {
                            _mm256_dpwssd_epi32(scaled[j], bias_k, x_sums)
                        } else {
                            _mm256_add_epi32(scaled[j], _mm256_madd_epi16(bias_k, x_sums))
                        };
                    }
                }
                if let Some(o) = offset {
                    let at = (g * groups + b) * GROUP_ROWS;
                    let m = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(o.k.as_ptr().add(at).cast())));
                    for j in 0..T {
                        offsets[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(*acts[j].sums32.get_unchecked(b)), offsets[j]);
                    }
                }
            }
            let at = (g * groups + first * ACT_BLOCK / w.group) * GROUP_ROWS;
            end_super_block(&mut acc, &scaled, &offsets, scale, offset, at, acts, first);
        }
        for j in 0..T {
            _mm256_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
        }
    }

    /// Group g's 8 rows times the first `T` of `acts`, into `sums[token][row]`; `HALVES`: a scale
    /// per 16 weights (chunks 0-3 of a block are its first 16, 4-7 its second); `SIX`: 6-bit
    /// levels, whose bias comes off each 16 weights' i32 sum.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const T: usize, const HALVES: bool, const SIX: bool, S: EightScales>(
        w: &ByteGroupRows<'_>,
        scale: S,
        offset: Option<S>,
        g: usize,
        acts: &[ActRow<'_>; TOKENS],
        sums: &mut TileSums,
    ) {
        let (blocks, groups) = (w.cols / ACT_BLOCK, w.cols / w.group);
        let (levels, block_bytes) = group_blocks(w, g, blocks);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..blocks {
            let block = levels.add(b * block_bytes);
            prefetch_ahead(block, block_bytes);
            // i32 sums of each row's first and second 16 weights.
            let mut first = [_mm256_setzero_si256(); T];
            let mut second = [_mm256_setzero_si256(); T];
            for k in 0..8 {
                let levels = chunk::<SIX>(block, k);
                for j in 0..T {
                    let x = x_chunk(&acts[j], b, k);
                    let (w_bytes, x_bytes) = operands::<SIX>(levels, x);
                    // At most 2 · 128 · 127 a pair, within i16.
                    let four = _mm256_madd_epi16(_mm256_maddubs_epi16(w_bytes, x_bytes), ones);
                    if k >= 4 {
                        second[j] = _mm256_add_epi32(second[j], four);
                    } else {
                        first[j] = _mm256_add_epi32(first[j], four);
                    }
                }
            }
            if SIX {
                for j in 0..T {
                    first[j] = _mm256_sub_epi32(first[j], six_bit_bias(&acts[j], 2 * b));
                    second[j] = _mm256_sub_epi32(second[j], six_bit_bias(&acts[j], 2 * b + 1));
                }
            }
            let (scale_first, scale_second) = if HALVES {
                (scale.eight((g * groups + 2 * b) * GROUP_ROWS), scale.eight((g * groups + 2 * b + 1) * GROUP_ROWS))
            } else {
                let s = scale.eight((g * groups + b) * GROUP_ROWS);
                (s, s)
            };
            let offset = offset.map(|o| o.eight((g * groups + b) * GROUP_ROWS));
            for j in 0..T {
                let d = _mm256_set1_ps(*acts[j].d.get_unchecked(b));
                if HALVES {
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first[j]), _mm256_mul_ps(scale_first, d), acc[j]);
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second[j]), _mm256_mul_ps(scale_second, d), acc[j]);
                } else {
                    let block_sum = _mm256_add_epi32(first[j], second[j]);
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum), _mm256_mul_ps(scale_first, d), acc[j]);
                }
                if let Some(offset) = offset {
                    acc[j] = _mm256_fmadd_ps(offset, _mm256_set1_ps(*acts[j].sums32.get_unchecked(b)), acc[j]);
                }
            }
        }
        for j in 0..T {
            _mm256_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activations::ActFormat;
    use crate::activations::Q8K_BLOCK;
    use crate::dot::{int_products, IntRows, Levels};
    use crate::factored::{test_factors, UnitLayout};
    use crate::interleaved::interleave_values;
    use crate::interleaved::tests::{check_products, FactoredRun};

    /// The interleaved byte products give the row kernels' sums for the same weights (up to the
    /// order of the f32 additions), with byte and 6-bit levels, with scales per 32 and per 16,
    /// f32 and f16, with and without offsets, for one token, a whole tile and a tile's remainder.
    #[test]
    fn interleaved_byte_products_are_the_row_layouts() {
        let (rows, cols) = (16, 256);
        let blocks = cols / ACT_BLOCK;
        let byte_levels: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
        let mut woven = vec![0i8; rows * cols];
        // Every 6-bit level (-32..31), in no simple order.
        let six_bit_levels: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 64) as i32 - 32) as i8).collect();
        let mut six_bits = vec![0u8; rows * cols * 3 / 4];
        for r in 0..rows {
            for b in 0..blocks {
                let at = (r * blocks + b) * ACT_BLOCK;
                for e in 0..ACT_BLOCK {
                    woven[level_index(r, b, e, blocks)] = byte_levels[at + e];
                }
                put_six_bit_block(&mut six_bits, r, b, blocks, &six_bit_levels[at..at + ACT_BLOCK]);
            }
        }
        let kinds = [("bytes", &byte_levels, WovenLevels::Bytes(&woven)), ("6-bit", &six_bit_levels, WovenLevels::SixBits(&six_bits))];
        for (kind, plain_levels, levels) in kinds {
            assert_eq!(&deinterleave_levels(levels, rows, cols), plain_levels, "{kind}");
            check_layout(kind, plain_levels, levels, rows, cols);
        }
    }

    /// `interleaved_byte_products_are_the_row_layouts` for one kind of levels.
    fn check_layout(kind: &str, plain_levels: &[i8], woven: WovenLevels<'_>, rows: usize, cols: usize) {
        // Every token count up to 8 (the AVX2 tiles take up to 4, the factored AVX512-VNNI ones
        // 8), and several tiles with a short last one (19).
        let counts = [1, 2, 3, 4, 5, 6, 7, 8, 19];
        let x: Vec<f32> = (0..19 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
        for group in [32, 16] {
            let groups = cols / group;
            // Exact in f16, so both storages give the same sums.
            let scale: Vec<f32> = (0..rows * groups).map(|g| (1 + g % 11) as f32 / 256.0).collect();
            let offset: Vec<f32> = (0..rows * groups).map(|g| -((g % 13) as f32) / 64.0).collect();
            let (scale_w, offset_w) = (interleave_values(&scale, rows, groups, false), interleave_values(&offset, rows, groups, false));
            let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
            let (scale16, scale16_w) = (to_f16(&scale), to_f16(&scale_w));
            for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| counts.map(|n| (f, n))) {
                let xq = QuantizedRows::new(&x[..n * cols], format);
                let offsets = if group == ACT_BLOCK { vec![false, true] } else { vec![false] };
                for with_offset in offsets {
                    for (s, s_w) in [(Scales::F32(&scale), Scales::F32(&scale_w)), (Scales::F16(&scale16), Scales::F16(&scale16_w))] {
                        let (o, o_w) = (with_offset.then_some(Scales::F32(&offset)), with_offset.then_some(Scales::F32(&offset_w)));
                        let plain = IntRows { levels: Levels::Bytes(plain_levels), group, scale: s, offset: o, cols };
                        let w = ByteGroupRows { levels: woven, group, scale: s_w, offset: o_w, cols };
                        check(w, plain, &xq, &format!("{kind} group {group} {format:?} n {n} offset {with_offset}"));
                    }
                    // K-quant scales and offsets kept factored (the i32 super-block tiles with
                    // Q8_K activations), integers over i8's whole range.
                    let per_unit = Q8K_BLOCK / group;
                    let (scale, units, k) = test_factors(rows, groups, per_unit, 1);
                    let (offset, offset_units, offset_k) = test_factors(rows, groups, per_unit, 2);
                    let layout = UnitLayout::new(per_unit, GROUP_ROWS);
                    let s_w = Scales::Factored { units: &units, k: &k, layout };
                    let o_w = with_offset.then_some(Scales::Factored { units: &offset_units, k: &offset_k, layout });
                    let plain = IntRows {
                        levels: Levels::Bytes(plain_levels),
                        group,
                        scale: Scales::F32(&scale),
                        offset: with_offset.then_some(Scales::F32(&offset)),
                        cols,
                    };
                    let w = ByteGroupRows { levels: woven, group, scale: s_w, offset: o_w, cols };
                    check(w, plain, &xq, &format!("{kind} factored group {group} {format:?} n {n} offset {with_offset}"));
                }
            }
        }
    }

    /// The SIMD and the portable interleaved products of `w` give the row kernels' of `plain`
    /// (the same weights), up to the order of the f32 additions.
    fn check(w: ByteGroupRows<'_>, plain: IntRows<'_>, xq: &QuantizedRows, what: &str) {
        let (rows, n) = (w.rows(), xq.rows(w.cols));
        #[cfg(target_arch = "x86_64")]
        let factored = crate::dot::avx2::FactoredLanes::super_blocks(w.scale, w.offset, w.group, w.cols, xq).map(|(scale, offset)| {
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
}
