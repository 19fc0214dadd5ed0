//! The interleaved 4-bit products (`interleaved::nibbles`) in AVX2: a tile takes a group's 8
//! rows times up to 4 tokens, a block's 4 chunks of 8 rows at a time; with AVX512-VNNI (factored
//! scales or whole ones), a pair of groups' 16 rows times up to 8 tokens in 512-bit vectors.

use std::arch::x86_64::*;

use super::prefetch_ahead;
use super::scales::{end_super_block, with_eight_scales, EightScales, FactoredLanes};
use super::tiles::{
    add_pair_block, by_tiles, join_halves, minus_bias_pairs, pair_chunk, pair_scales, store_pair_sums, tile_tokens, unbias, x_chunk,
    FactoredRows, ScaledRows, TileSums, TOKENS,
};
use crate::activations::QuantizedRows;
use crate::interleaved::nibbles::{GroupRows, ROW_BLOCK_BYTES};
use crate::interleaved::GROUP_ROWS;
use crate::rows::ActRow;
use crate::ACT_BLOCK;

/// Bytes of one group's block.
const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * ROW_BLOCK_BYTES;

/// `interleaved::products` by the tiles of whole scales and offsets (`EightScales`), for
/// rows without factored ones (`WovenRows::factored`): with AVX512-VNNI (`vnni`) pairs of
/// groups times up to 8 tokens (`pair_tile_vnni_whole`), else AVX2's `tile`.
///
/// # Safety
/// AVX2, FMA and F16C are present, AVX512-VNNI (`x86::has_avx512_vnni`) where `vnni`, and `w`,
/// `x` and `out` have the shapes `products` checks.
pub(crate) unsafe fn products(w: GroupRows<'_>, x: &QuantizedRows, out: &mut [f32], rows: usize, n: usize, vnni: bool) {
    with_eight_scales!(w.scale, w.offset, |scale, offset| {
        let w = ScaledRows { rows: w, scale, offset };
        by_tiles(x, w.rows.cols, rows, n, out, tile_tokens(vnni), vnni, |g, pair, acts, tokens, sums| match (vnni, tokens) {
            // SAFETY: as this function's.
            (true, 8) => unsafe { pair_tile_vnni_whole::<8, _>(w, g, pair, acts, sums) },
            (true, 7) => unsafe { pair_tile_vnni_whole::<7, _>(w, g, pair, acts, sums) },
            (true, 6) => unsafe { pair_tile_vnni_whole::<6, _>(w, g, pair, acts, sums) },
            (true, 5) => unsafe { pair_tile_vnni_whole::<5, _>(w, g, pair, acts, sums) },
            (true, 4) => unsafe { pair_tile_vnni_whole::<4, _>(w, g, pair, acts, sums) },
            (true, 3) => unsafe { pair_tile_vnni_whole::<3, _>(w, g, pair, acts, sums) },
            (true, 2) => unsafe { pair_tile_vnni_whole::<2, _>(w, g, pair, acts, sums) },
            (true, _) => unsafe { pair_tile_vnni_whole::<1, _>(w, g, pair, acts, sums) },
            (false, 4) => unsafe { tile::<4, _>(w, g, acts, sums) },
            (false, 3) => unsafe { tile::<3, _>(w, g, acts, sums) },
            (false, 2) => unsafe { tile::<2, _>(w, g, acts, sums) },
            (false, _) => unsafe { tile::<1, _>(w, g, acts, sums) },
        })
    });
}

/// `interleaved::products` of factored scales with Q8_K activations (`WovenRows::factored`),
/// with AVX512-VNNI's `dpbusd` on pairs of groups in 512-bit vectors where `vnni`
/// (`pair_tile_vnni`).
///
/// # Safety
/// As `products`'s, the layout checked by `super_blocks`, and AVX512-VNNI
/// (`x86::has_avx512_vnni`) present where `vnni`.
pub(crate) unsafe fn factored_products(
    w: FactoredRows<'_, GroupRows<'_>>,
    x: &QuantizedRows,
    out: &mut [f32],
    rows: usize,
    n: usize,
    vnni: bool,
) {
    by_tiles(x, w.rows.cols, rows, n, out, tile_tokens(vnni), vnni, |g, pair, acts, tokens, sums| match (vnni, tokens) {
        // SAFETY: as this function's.
        (true, 8) => unsafe { pair_tile_vnni::<8>(w, g, pair, acts, sums) },
        (true, 7) => unsafe { pair_tile_vnni::<7>(w, g, pair, acts, sums) },
        (true, 6) => unsafe { pair_tile_vnni::<6>(w, g, pair, acts, sums) },
        (true, 5) => unsafe { pair_tile_vnni::<5>(w, g, pair, acts, sums) },
        (true, 4) => unsafe { pair_tile_vnni::<4>(w, g, pair, acts, sums) },
        (true, 3) => unsafe { pair_tile_vnni::<3>(w, g, pair, acts, sums) },
        (true, 2) => unsafe { pair_tile_vnni::<2>(w, g, pair, acts, sums) },
        (true, _) => unsafe { pair_tile_vnni::<1>(w, g, pair, acts, sums) },
        (false, 4) => unsafe { tile_factored::<4>(w, g, acts, sums) },
        (false, 3) => unsafe { tile_factored::<3>(w, g, acts, sums) },
        (false, 2) => unsafe { tile_factored::<2>(w, g, acts, sums) },
        (false, _) => unsafe { tile_factored::<1>(w, g, acts, sums) },
    });
}

/// Group g's first block of levels.
///
/// # Safety
/// Group g is within `w`'s levels.
#[inline(always)]
unsafe fn group_levels(w: &GroupRows<'_>, g: usize, blocks: usize) -> *const u8 {
    w.levels.as_ptr().add(g * blocks * GROUP_BLOCK_BYTES)
}

/// The 4 chunks of the group's block at `block` split into their low nibbles (chunk k: levels
/// `4k..4k + 4` of each of the 8 rows) and their high ones (levels `16 + 4k..`), after asking
/// for the cache lines `PREFETCH_BYTES` ahead.
///
/// # Safety
/// AVX2 is present (inlined into callers that enable it), and the block is whole.
#[inline(always)]
unsafe fn nibble_chunks(block: *const u8) -> ([__m256i; 4], [__m256i; 4]) {
    prefetch_ahead(block, GROUP_BLOCK_BYTES);
    let mask = _mm256_set1_epi8(0x0F);
    let (mut low, mut high) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
    for k in 0..4 {
        let raw = _mm256_loadu_si256(block.add(32 * k).cast());
        low[k] = _mm256_and_si256(raw, mask);
        high[k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    }
    (low, high)
}

/// The i16 pair sums of a group's block (`nibble_chunks`) times block `b` of `act`, for the
/// 8 rows: each maddubs lane pair is at most 2 · 15 · 128 apart from zero, so the 8 of them add
/// up in i16 without overflow.
///
/// # Safety
/// AVX2 is present (inlined into callers that enable it), and `act` has block `b`.
#[inline(always)]
unsafe fn pair_sums(low: &[__m256i; 4], high: &[__m256i; 4], act: &ActRow<'_>, b: usize) -> __m256i {
    let mut pairs = _mm256_setzero_si256();
    for k in 0..4 {
        let (x_low, x_high) = (x_chunk(act, b, k), x_chunk(act, b, 4 + k));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low[k], x_low));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(high[k], x_high));
    }
    pairs
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
unsafe fn tile_factored<const T: usize>(w: FactoredRows<'_, GroupRows<'_>>, g: usize, acts: &[ActRow<'_>; TOKENS], sums: &mut TileSums) {
    let ScaledRows { rows: w, scale, offset } = w;
    let blocks = w.cols / ACT_BLOCK;
    let per_unit = scale.layout.per_unit();
    let levels = group_levels(&w, g, blocks);
    let low16 = _mm256_set1_epi32(0xFFFF);
    let mut acc = [_mm256_setzero_ps(); T];
    for first in (0..blocks).step_by(per_unit) {
        let mut scaled = [_mm256_setzero_si256(); T];
        let mut offsets = [_mm256_setzero_ps(); T];
        for b in first..first + per_unit {
            let (low, high) = nibble_chunks(levels.add(b * GROUP_BLOCK_BYTES));
            let at = (g * blocks + b) * GROUP_ROWS;
            // Row r's integer scale in both i16 halves of lane r.
            let k32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(scale.k.as_ptr().add(at).cast()));
            let k16 = _mm256_or_si256(_mm256_and_si256(k32, low16), _mm256_slli_epi32(k32, 16));
            let m = offset.map(|o| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(o.k.as_ptr().add(at).cast()))));
            for j in 0..T {
                scaled[j] = _mm256_add_epi32(scaled[j], _mm256_madd_epi16(pair_sums(&low, &high, &acts[j], b), k16));
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
    w: FactoredRows<'_, GroupRows<'_>>,
    g: usize,
    pair: bool,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let blocks = w.cols / ACT_BLOCK;
    let per_unit = scale.layout.per_unit();
    let levels = group_levels(&w, g, blocks);
    // The high half's blocks, and its scales', offsets' and units' lanes, are the low half's
    // moved by `next` and `next_lanes`: group g + 1's, or group g's own.
    let groups = usize::from(pair);
    let (next, next_lanes) = (groups * blocks * GROUP_BLOCK_BYTES, groups * blocks * GROUP_ROWS);
    // A pair's two 8-lane runs at `at` and `at + next_lanes`: one as 16 i32 lanes, the other
    // as 16 f32 lanes.
    let ints = |k: &[i8], at: usize| {
        let two = _mm_unpacklo_epi64(_mm_loadl_epi64(k.as_ptr().add(at).cast()), _mm_loadl_epi64(k.as_ptr().add(at + next_lanes).cast()));
        _mm512_cvtepi8_epi32(two)
    };
    let units = |lanes: FactoredLanes<'_>, at: usize| {
        let half = |at: usize| _mm256_loadu_ps(lanes.units.as_ptr().add(lanes.layout.unit_of(at)));
        join_halves(half(at), half(at + next_lanes))
    };
    let mut acc = [_mm512_setzero_ps(); T];
    for first in (0..blocks).step_by(per_unit) {
        let mut scaled = [_mm512_setzero_si512(); T];
        let mut offsets = [_mm512_setzero_ps(); T];
        for b in first..first + per_unit {
            let (low, high) = pair_nibble_chunks(levels.add(b * GROUP_BLOCK_BYTES), next);
            let at = (g * blocks + b) * GROUP_ROWS;
            let k32 = ints(scale.k, at);
            let m = offset.map(|o| _mm512_cvtepi32_ps(ints(o.k, at)));
            for j in 0..T {
                let block_sums = pair_block_sums(&low, &high, &acts[j], b);
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
    store_pair_sums(&acc, sums);
}

/// The 4 chunks of a pair tile's block at `block` (group g's) and `block + next` (group g + 1's,
/// or g's own where `next` is 0), split into their low nibbles and high ones as
/// `nibble_chunks` splits one group's, after asking for both blocks' cache lines ahead.
///
/// # Safety
/// AVX512F and AVX512BW are present (inlined into callers that enable them), and both blocks
/// are whole.
#[inline(always)]
unsafe fn pair_nibble_chunks(block: *const u8, next: usize) -> ([__m512i; 4], [__m512i; 4]) {
    prefetch_ahead(block, GROUP_BLOCK_BYTES);
    prefetch_ahead(block.wrapping_add(next), GROUP_BLOCK_BYTES);
    let mask = _mm512_set1_epi8(0x0F);
    let raw: [__m512i; 4] = std::array::from_fn(|k| pair_chunk(block.add(32 * k), block.add(next + 32 * k)));
    let low = std::array::from_fn(|k| _mm512_and_si512(raw[k], mask));
    let high = std::array::from_fn(|k| _mm512_and_si512(_mm512_srli_epi16::<4>(raw[k]), mask));
    (low, high)
}

/// A pair tile's i32 sums of its 16 rows' block (`pair_nibble_chunks`) times block `b` of
/// `act`: `dpbusd` of each chunk with the 4 activation bytes it multiplies, broadcast. At most
/// 32 · 15 · 128 in magnitude.
///
/// # Safety
/// AVX512-VNNI is present (inlined into callers that enable it), and `act` has block `b`.
#[inline(always)]
unsafe fn pair_block_sums(low: &[__m512i; 4], high: &[__m512i; 4], act: &ActRow<'_>, b: usize) -> __m512i {
    let q = act.q.as_ptr().add(b * ACT_BLOCK);
    let mut sums = _mm512_setzero_si512();
    for k in 0..4 {
        let x_low = _mm512_set1_epi32(q.add(4 * k).cast::<i32>().read_unaligned());
        let x_high = _mm512_set1_epi32(q.add(16 + 4 * k).cast::<i32>().read_unaligned());
        sums = _mm512_dpbusd_epi32(sums, low[k], x_low);
        sums = _mm512_dpbusd_epi32(sums, high[k], x_high);
    }
    sums
}

/// `tile` with AVX512-VNNI for whole scales and offsets (Q4_0, Q4_1), on pairs of groups as
/// `pair_tile_vnni` takes them: each block's `dpbusd` sums (`pair_block_sums`) lose Q4_0's bias
/// in integers (`unbias`), then convert once a block for the rows' scales times the token's
/// to multiply. A quarter of AVX2's instructions per weight: one `dpbusd` where it takes a
/// `maddubs` and an add, for 16 rows where it has 8, and no widening `madd`. Bounds: a block's
/// sums within 32 · 15 · 128 and its bias within 8 · 32 · 128, exact in f32.
///
/// # Safety
/// As `products`'s with `vnni`, and group g (and g + 1 where `pair`) is within `w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_tile_vnni_whole<const T: usize, S: EightScales>(
    w: ScaledRows<GroupRows<'_>, S>,
    g: usize,
    pair: bool,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let blocks = w.cols / ACT_BLOCK;
    let levels = group_levels(&w, g, blocks);
    let groups = usize::from(pair);
    let (next, next_lanes) = (groups * blocks * GROUP_BLOCK_BYTES, groups * blocks * GROUP_ROWS);
    // The bias is 8 (Q4_0) or 0: an exact small integer.
    debug_assert!(w.bias == 0.0 || w.bias == 8.0, "a nibble bias of {}", w.bias);
    let bias = w.bias as i16;
    let minus_bias = minus_bias_pairs(bias);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..blocks {
        let (low, high) = pair_nibble_chunks(levels.add(b * GROUP_BLOCK_BYTES), next);
        let (scale, offset) = pair_scales(scale, offset, (g * blocks + b) * GROUP_ROWS, next_lanes);
        for j in 0..T {
            let mut block_sums = pair_block_sums(&low, &high, &acts[j], b);
            if bias != 0 {
                block_sums = unbias(block_sums, minus_bias, &acts[j], b);
            }
            add_pair_block(&mut acc[j], block_sums, scale, offset, &acts[j], b);
        }
    }
    store_pair_sums(&acc, sums);
}

/// Group g's 8 rows times the first `T` of `acts`, into `sums[token][row]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize, S: EightScales>(
    w: ScaledRows<GroupRows<'_>, S>,
    g: usize,
    acts: &[ActRow<'_>; TOKENS],
    sums: &mut TileSums,
) {
    let ScaledRows { rows: w, scale, offset } = w;
    let blocks = w.cols / ACT_BLOCK;
    let levels = group_levels(&w, g, blocks);
    let (ones, minus_bias) = (_mm256_set1_epi16(1), _mm256_set1_ps(-w.bias));
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..blocks {
        let (low, high) = nibble_chunks(levels.add(b * GROUP_BLOCK_BYTES));
        let at = (g * blocks + b) * GROUP_ROWS;
        let scale = scale.eight(at);
        let offset = offset.map(|o| o.eight(at));
        for j in 0..T {
            // The 8 rows' pair sums (`pair_sums`), then one madd makes their i32 sums.
            let block_sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pair_sums(&low, &high, &acts[j], b), ones));
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
