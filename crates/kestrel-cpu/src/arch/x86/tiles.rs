//! What the interleaved tiles of both layouts (`interleaved`, `interleaved_bytes`) share: a
//! product's walk over its groups of 8 rows and its token tiles, and a tile's inputs.

use std::arch::x86_64::*;

use super::scales::{EightScales, FactoredLanes};
use crate::activations::QuantizedRows;
use crate::interleaved::GROUP_ROWS;
use crate::rows::ActRow;
use crate::ACT_BLOCK;

/// Tokens a tile computes at most: each group's block is loaded (and split into nibbles) once
/// for them. The AVX2 tiles take up to 4 (`TILE_TOKENS`), whose accumulators fit AVX2's 16
/// vector registers; the AVX512-VNNI tiles (factored or of whole scales) up to 8 in its 32.
pub(crate) const TOKENS: usize = 8;
/// Tokens the AVX2 tiles take at most.
pub(crate) const TILE_TOKENS: usize = 4;

/// Tokens a tile takes at most: `TOKENS` with AVX512-VNNI (`vnni`), else
/// `TILE_TOKENS`.
pub(crate) fn tile_tokens(vnni: bool) -> usize {
    if vnni {
        TOKENS
    } else {
        TILE_TOKENS
    }
}

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

/// A product's weight rows (`W`: a layout's group rows) and the readers of their scales and
/// offsets (`EightScales`, or `FactoredLanes` for the factored tiles): what each of its tiles
/// reads besides its group of rows and its tokens.
#[derive(Clone, Copy)]
pub(crate) struct ScaledRows<W, S> {
    pub rows: W,
    pub scale: S,
    pub offset: Option<S>,
}

/// Rows with factored scales and offsets, as the factored tiles take them.
pub(crate) type FactoredRows<'a, W> = ScaledRows<W, FactoredLanes<'a>>;

/// Activation bytes `4k..4k + 4` of block `b` of `act`, in every lane: what chunk `k` of a
/// group's block multiplies.
///
/// # Safety
/// AVX is present (inlined into callers that enable AVX2), and `act` has block `b`.
#[inline(always)]
pub(crate) unsafe fn x_chunk(act: &ActRow<'_>, b: usize, k: usize) -> __m256i {
    _mm256_set1_epi32(act.q.as_ptr().add(b * ACT_BLOCK + 4 * k).cast::<i32>().read_unaligned())
}

/// Two 8-lane f32 vectors as one of 16 lanes, `low` in lanes 0-7: a pair tile's two groups'
/// values. (Joined as integers: AVX512F inserts 256-bit halves of 64-bit lanes only, and 32-bit
/// ones need AVX512DQ.)
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it).
#[inline(always)]
pub(crate) unsafe fn join_halves(low: __m256, high: __m256) -> __m512 {
    _mm512_castsi512_ps(join_chunks(_mm256_castps_si256(low), _mm256_castps_si256(high)))
}

/// Two 256-bit integer vectors as one, `low` in the low half: a pair tile's chunk of its two
/// groups' levels, each rebuilt on its own.
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it).
#[inline(always)]
pub(crate) unsafe fn join_chunks(low: __m256i, high: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
}

/// The 32 bytes at `low` and the 32 at `high` as one 512-bit vector: a pair tile's chunk of its
/// two groups' levels.
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it), and both runs are readable.
#[inline(always)]
pub(crate) unsafe fn pair_chunk(low: *const u8, high: *const u8) -> __m512i {
    join_chunks(_mm256_loadu_si256(low.cast()), _mm256_loadu_si256(high.cast()))
}

/// A block's i32 sums `sums` with the levels' bias taken off in integers, for a pair tile of
/// whole scales: `sums - bias · Σ q` in every lane, `Σ q` block `b`'s of `act`, by one `dpwssd` of `minus_bias` (the bias negated
/// in both i16 halves of each lane: `minus_bias_pairs`) with the block's two sums of 16
/// (`level_sums16`). Exact: the bias is at most 128 and a block's `Σ q` at most 32 · 128.
///
/// # Safety
/// AVX512-VNNI is present (inlined into callers that enable it), and `act` has block `b`.
#[inline(always)]
pub(crate) unsafe fn unbias(sums: __m512i, minus_bias: __m512i, act: &ActRow<'_>, b: usize) -> __m512i {
    let x_sums = _mm512_set1_epi32(act.level_sums16.as_ptr().add(2 * b).cast::<i32>().read_unaligned());
    _mm512_dpwssd_epi32(sums, minus_bias, x_sums)
}

/// `-bias` in both i16 halves of every lane, as `unbias` takes it.
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it).
#[inline(always)]
pub(crate) unsafe fn minus_bias_pairs(bias: i16) -> __m512i {
    _mm512_set1_epi16(-bias)
}

/// A pair tile's scales (and offsets) of whole storage for the block at value `at`: group g's 8
/// rows' at `at`, g + 1's (or g's own) `next_lanes` on.
///
/// # Safety
/// AVX2, F16C and AVX512F are present (inlined into callers that enable them), and the values
/// have both runs of 8.
#[inline(always)]
pub(crate) unsafe fn pair_scales<S: EightScales>(scale: S, offset: Option<S>, at: usize, next_lanes: usize) -> (__m512, Option<__m512>) {
    let sixteen = |s: S| join_halves(s.eight(at), s.eight(at + next_lanes));
    (sixteen(scale), offset.map(sixteen))
}

/// Adds block `b`'s 16 rows' i32 sums with `act` (`sums`, the bias already off) to `acc`, in a
/// pair tile of whole scales: `sums · scale · d` in one convert and one FMA, and the offsets
/// times the token's block sum.
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it), and `act` has block `b`.
#[inline(always)]
pub(crate) unsafe fn add_pair_block(acc: &mut __m512, sums: __m512i, scale: __m512, offset: Option<__m512>, act: &ActRow<'_>, b: usize) {
    let d = _mm512_set1_ps(*act.d.get_unchecked(b));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(scale, d), *acc);
    if let Some(offset) = offset {
        *acc = _mm512_fmadd_ps(offset, _mm512_set1_ps(*act.sums32.get_unchecked(b)), *acc);
    }
}

/// A pair tile's accumulators into its tokens' sums (16 rows each).
///
/// # Safety
/// AVX512F is present (inlined into callers that enable it).
#[inline(always)]
pub(crate) unsafe fn store_pair_sums<const T: usize>(acc: &[__m512; T], sums: &mut TileSums) {
    for j in 0..T {
        _mm512_storeu_ps(sums[j].as_mut_ptr(), acc[j]);
    }
}
