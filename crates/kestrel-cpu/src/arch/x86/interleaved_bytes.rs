//! The interleaved byte and 6-bit products (`interleaved::bytes`) in AVX2: a tile takes a
//! group's 8 rows times up to 4 tokens, a block's 8 chunks of 8 rows at a time; with AVX512-VNNI,
//! factored scales take up to 8 tokens, each span of one integer scale summed by `dpbusd`, and
//! byte or 6-bit levels of whole scales per 32 a pair of groups' 16 rows times up to 8 tokens.

use std::arch::x86_64::*;

use super::prefetch_ahead;
use super::scales::{end_super_block, with_eight_scales, EightScales};
use super::tiles::{
    add_pair_block, by_tiles, join_chunks, minus_bias_pairs, pair_chunk, pair_scales, store_pair_sums, tile_tokens, unbias, x_chunk,
    FactoredRows, ScaledRows, TileSums, TILE_TOKENS, TOKENS,
};
use crate::activations::{QuantizedRows, Q8K_BLOCK};
use crate::interleaved::bytes::{ByteGroupRows, WovenLevels, SIX_BIT_BIAS, SIX_BIT_HIGH};
use crate::interleaved::GROUP_ROWS;
use crate::rows::ActRow;
use crate::ACT_BLOCK;

/// `$body` with the constants `$halves` and `$six` of the rows `$w`'s layout, for the tiles it
/// names to be compiled for it: `$halves`, a scale per 16 weights (chunks 0-3 of a block are its
/// first 16, 4-7 its second); `$six`, 6-bit levels.
macro_rules! with_layout {
    ($w:expr, |$halves:ident, $six:ident| $body:expr) => {
        match ($w.group != ACT_BLOCK, matches!($w.levels, WovenLevels::SixBits(_))) {
            (false, false) => with_layout!(@as false, false, $halves, $six, $body),
            (false, true) => with_layout!(@as false, true, $halves, $six, $body),
            (true, false) => with_layout!(@as true, false, $halves, $six, $body),
            (true, true) => with_layout!(@as true, true, $halves, $six, $body),
        }
    };
    (@as $h:literal, $s:literal, $halves:ident, $six:ident, $body:expr) => {{
        const $halves: bool = $h;
        const $six: bool = $s;
        $body
    }};
}

/// `interleaved::products` by the tiles of whole scales and offsets (`EightScales`), for
/// rows without factored ones (`WovenRows::factored`): with AVX512-VNNI (`vnni`) levels of a
/// scale per 32 (Q8_0's bytes, Q5_0's and Q5_1's 6 bits) take pairs of groups times up to 8
/// tokens (`pair_tile_vnni_whole`), the rest AVX2's `tile`.
///
/// # Safety
/// AVX2, FMA and F16C are present, AVX512-VNNI (`x86::has_avx512_vnni`) where `vnni`, and `w`,
/// `x` and `out` have the shapes `products` checks.
pub(crate) unsafe fn products(w: ByteGroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
    let pairs = vnni && w.group == ACT_BLOCK;
    with_eight_scales!(w.scale, w.offset, |scale, offset| {
        let w = ScaledRows { rows: w, scale, offset };
        if pairs {
            by_tiles(x, w.rows.cols, rows, n, out, TOKENS, true, |g, pair, acts, tokens, sums| match tokens {
                // SAFETY: as this function's, with AVX512-VNNI present (`vnni`).
                8 => unsafe { pair_tile_vnni_whole::<8, _>(w, g, pair, acts, sums) },
                7 => unsafe { pair_tile_vnni_whole::<7, _>(w, g, pair, acts, sums) },
                6 => unsafe { pair_tile_vnni_whole::<6, _>(w, g, pair, acts, sums) },
                5 => unsafe { pair_tile_vnni_whole::<5, _>(w, g, pair, acts, sums) },
                4 => unsafe { pair_tile_vnni_whole::<4, _>(w, g, pair, acts, sums) },
                3 => unsafe { pair_tile_vnni_whole::<3, _>(w, g, pair, acts, sums) },
                2 => unsafe { pair_tile_vnni_whole::<2, _>(w, g, pair, acts, sums) },
                _ => unsafe { pair_tile_vnni_whole::<1, _>(w, g, pair, acts, sums) },
            });
            return;
        }
        with_layout!(w.rows, |HALVES, SIX| by_tiles(x, w.rows.cols, rows, n, out, TILE_TOKENS, false, |g, _, acts, tokens, sums| {
            match tokens {
                // SAFETY: as this function's.
                4 => unsafe { tile::<4, HALVES, SIX, _>(w, g, acts, sums) },
                3 => unsafe { tile::<3, HALVES, SIX, _>(w, g, acts, sums) },
                2 => unsafe { tile::<2, HALVES, SIX, _>(w, g, acts, sums) },
                _ => unsafe { tile::<1, HALVES, SIX, _>(w, g, acts, sums) },
            }
        }))
    });
}

/// Byte or 6-bit levels of a scale per 32 (`products`' `pairs`) in AVX512-VNNI, on pairs of
/// groups as the nibble tile (`interleaved::pair_tile_vnni_whole`) takes them: `dpbusd`
/// multiplies unsigned bytes by signed ones, so each chunk's signed byte levels go in with their
/// sign bit flipped (`level + 128`, once a chunk for every token), 6-bit ones as they are kept
/// (`level + 32`), and each block's sums lose that bias times `Σ q` in integers (`unbias`).
/// AVX2's `tile` gives each chunk of bytes the levels' signs for every token instead (two
/// `sign`s, a `maddubs`, a `madd` and an add a chunk and token, for 8 rows), where this takes one
/// `dpbusd` for 16. Bounds: a block's sums within 32 · 255 · 128 and its bias within
/// 128 · 32 · 128, exact in f32.
///
/// # Safety
/// AVX2, FMA, F16C and AVX512-VNNI are present, `w`, `x` and `out` have the shapes `products`
/// checks, `w` has byte levels of a scale per 32, and group g (and g + 1 where `pair`) is within it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_tile_vnni_whole<const T: usize, S: EightScales>(
    w: ScaledRows<ByteGroupRows<'_>, S>,
    g: usize,
    pair: bool,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let blocks = w.cols / ACT_BLOCK;
    let (levels, block_bytes) = group_blocks(&w, g, blocks);
    let groups = usize::from(pair);
    let (next, next_lanes) = (groups * blocks * block_bytes, groups * blocks * GROUP_ROWS);
    let six = matches!(w.levels, WovenLevels::SixBits(_));
    let sign_bits = _mm512_set1_epi8(i8::MIN);
    let minus_bias = minus_bias_pairs(if six { i16::from(SIX_BIT_BIAS) } else { 128 });
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        let block = levels.add(b * block_bytes);
        prefetch_ahead(block, block_bytes);
        prefetch_ahead(block.wrapping_add(next), block_bytes);
        let chunks: [__m512i; 8] = std::array::from_fn(|k| {
            if six {
                join_chunks(chunk::<true>(block, k), chunk::<true>(block.add(next), k))
            } else {
                _mm512_xor_si512(pair_chunk(block.add(32 * k), block.add(next + 32 * k)), sign_bits)
            }
        });
        let (scale, offset) = pair_scales(scale, offset, (g * blocks + b) * GROUP_ROWS, next_lanes);
        for j in 0..T {
            let q = acts[j].q.as_ptr().add(b * ACT_BLOCK);
            let mut block_sums = _mm512_setzero_si512();
            for (k, &chunk) in chunks.iter().enumerate() {
                block_sums = _mm512_dpbusd_epi32(block_sums, chunk, _mm512_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned()));
            }
            add_pair_block(&mut acc[j], unbias(block_sums, minus_bias, &acts[j], b), scale, offset, &acts[j], b);
        }
    }
    store_pair_sums(&acc, sums);
}

/// `interleaved::products` of factored scales with Q8_K activations (`WovenRows::factored`),
/// with AVX512-VNNI's `dpbusd` where `vnni`.
///
/// # Safety
/// As `products`'s, the layout checked by `super_blocks`, and AVX512-VNNI and AVX512VL
/// present where `vnni`.
pub(crate) unsafe fn factored_products(
    w: FactoredRows<'_, ByteGroupRows<'_>>,
    x: &QuantizedRows,
    out: &mut [f32],
    rows: usize,
    n: usize,
    vnni: bool,
) {
    with_layout!(w.rows, |HALVES, SIX| {
        by_tiles(x, w.rows.cols, rows, n, out, tile_tokens(vnni), false, |g, _, acts, tokens, sums| {
            // SAFETY: as this function's.
            unsafe {
                match (vnni, tokens) {
                    (false, 4) => tile_factored::<4, HALVES, SIX>(w, g, acts, sums),
                    (false, 3) => tile_factored::<3, HALVES, SIX>(w, g, acts, sums),
                    (false, 2) => tile_factored::<2, HALVES, SIX>(w, g, acts, sums),
                    (false, _) => tile_factored::<1, HALVES, SIX>(w, g, acts, sums),
                    (true, 8) => tile_factored_vnni::<8, HALVES, SIX>(w, g, acts, sums),
                    (true, 7) => tile_factored_vnni::<7, HALVES, SIX>(w, g, acts, sums),
                    (true, 6) => tile_factored_vnni::<6, HALVES, SIX>(w, g, acts, sums),
                    (true, 5) => tile_factored_vnni::<5, HALVES, SIX>(w, g, acts, sums),
                    (true, 4) => tile_factored_vnni::<4, HALVES, SIX>(w, g, acts, sums),
                    (true, 3) => tile_factored_vnni::<3, HALVES, SIX>(w, g, acts, sums),
                    (true, 2) => tile_factored_vnni::<2, HALVES, SIX>(w, g, acts, sums),
                    (true, _) => tile_factored_vnni::<1, HALVES, SIX>(w, g, acts, sums),
                }
            }
        })
    })
}

/// Writes `factored_tile` compiled for one instruction set: `tile_factored` (AVX2) and
/// `tile_factored_vnni` (AVX512-VNNI's `dpbusd` on 256-bit vectors) differ only in the
/// features they enable.
macro_rules! factored_tile_for {
    ($name:ident, $features:literal, $vnni:literal) => {
        /// `factored_tile` compiled for the instruction sets it is named by.
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: usize, const HALVES: bool, const SIX: bool>(
            w: FactoredRows<'_, ByteGroupRows<'_>>,
            g: usize,
            acts: &[ActRow<'_>; TOKENS],
            sums: &mut TileSums,
        ) {
            factored_tile::<T, HALVES, SIX, $vnni>(w, g, acts, sums)
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
    w: FactoredRows<'_, ByteGroupRows<'_>>,
    g: usize,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let (blocks, groups) = (w.cols / ACT_BLOCK, w.cols / w.group);
    let super_blocks = Q8K_BLOCK / ACT_BLOCK;
    let (levels, block_bytes) = group_blocks(&w, g, blocks);
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
    w: ScaledRows<ByteGroupRows<'_>, S>,
    g: usize,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let (blocks, groups) = (w.cols / ACT_BLOCK, w.cols / w.group);
    let (levels, block_bytes) = group_blocks(&w, g, blocks);
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
