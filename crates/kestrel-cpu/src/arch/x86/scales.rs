//! Scales and offsets read 8 at a time in f32 lanes, whatever their storage (f32, f16 or
//! factored: `rows::Scales`), and the end of a K-quant super-block, which the interleaved tiles
//! of both layouts share.

use std::arch::x86_64::*;

use crate::activations::{ActFormat, QuantizedRows, Q8K_BLOCK};
use crate::factored::UnitLayout;
use crate::rows::{ActRow, Scales};
use crate::ACT_BLOCK;

/// Values i..i + 8 of `s` (which has them) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn eight_scales(s: Scales<'_>, i: usize) -> __m256 {
    match s {
        Scales::F32(v) => _mm256_loadu_ps(v.as_ptr().add(i)),
        Scales::F16(h) => _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(i).cast())),
        // Interleaved rows from an 8-aligned value: lane r's unit is lane r of one unit group.
        Scales::Factored { units, k, layout } if layout.lanes() == 8 && i.is_multiple_of(8) => {
            let k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(k.as_ptr().add(i).cast())));
            _mm256_mul_ps(_mm256_loadu_ps(units.as_ptr().add(layout.unit_of(i))), k)
        }
        Scales::Factored { .. } => {
            _mm256_setr_ps(s.get(i), s.get(i + 1), s.get(i + 2), s.get(i + 3), s.get(i + 4), s.get(i + 5), s.get(i + 6), s.get(i + 7))
        }
    }
}

/// Scales or offsets read 8 interleaved lanes at a time, a type per storage: a tile is
/// compiled for its matrix's storage, where a `match` per block of weights (`eight_scales`)
/// cost factored scales a third of a decode step.
pub(crate) trait EightScales: Copy {
    /// Values i..i + 8 (which the values have, i a multiple of 8) as f32 lanes.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present, and the values have i..i + 8.
    unsafe fn eight(self, i: usize) -> __m256;
}

#[derive(Clone, Copy)]
pub(crate) struct F32Lanes<'a>(pub &'a [f32]);

#[derive(Clone, Copy)]
pub(crate) struct F16Lanes<'a>(pub &'a [u16]);

/// Factored values of 8 interleaved rows: lane r's unit is lane r of its unit group.
#[derive(Clone, Copy)]
pub(crate) struct FactoredLanes<'a> {
    pub units: &'a [f32],
    pub k: &'a [i8],
    pub layout: UnitLayout,
}

impl EightScales for F32Lanes<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(self, i: usize) -> __m256 {
        _mm256_loadu_ps(self.0.as_ptr().add(i))
    }
}

impl EightScales for F16Lanes<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(self, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(i).cast()))
    }
}

impl EightScales for FactoredLanes<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(self, i: usize) -> __m256 {
        let k = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(self.k.as_ptr().add(i).cast())));
        _mm256_mul_ps(_mm256_loadu_ps(self.units.as_ptr().add(self.layout.unit_of(i))), k)
    }
}

/// Any storage, matched per read: for scales and offsets stored alike in no pair above.
impl EightScales for Scales<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(self, i: usize) -> __m256 {
        eight_scales(self, i)
    }
}

/// Calls `$run(scale, offset)` (a closure, expanded once per arm so that each arm compiles
/// it for its own reader types) with the lane readers of a matrix's interleaved scales and
/// offsets (`Scales`, `Option<Scales>`).
macro_rules! with_eight_scales {
    ($scale:expr, $offset:expr, $run:expr) => {{
        use crate::arch::x86::scales::{F16Lanes, F32Lanes, FactoredLanes};
        use crate::rows::Scales;
        match ($scale, $offset) {
            (Scales::F32(s), None) => ($run)(F32Lanes(s), None::<F32Lanes<'_>>),
            (Scales::F32(s), Some(Scales::F32(o))) => ($run)(F32Lanes(s), Some(F32Lanes(o))),
            (Scales::F16(s), None) => ($run)(F16Lanes(s), None::<F16Lanes<'_>>),
            (Scales::F16(s), Some(Scales::F16(o))) => ($run)(F16Lanes(s), Some(F16Lanes(o))),
            (s, o) => match (FactoredLanes::of(s), o.map(FactoredLanes::of)) {
                (Some(s), None) => ($run)(s, None::<FactoredLanes<'_>>),
                (Some(s), Some(Some(o))) => ($run)(s, Some(o)),
                _ => ($run)(s, o),
            },
        }
    }};
}
pub(crate) use with_eight_scales;

/// Ends a super-block of the K-quant tiles (`interleaved`, `interleaved_bytes`): adds to
/// each token's `acc` the i32 sums of levels times integer scales (`scaled`) times the rows'
/// units and the token's activation scale (one a super-block: block `first`'s), and the
/// offsets' sums times their units. `at`: the super-block's first value of the scales.
///
/// # Safety
/// AVX2 and FMA are present; the scales have value `at`, and each of `acts` block `first`.
/// Inlined into its callers, which enable them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn end_super_block<const T: usize>(
    acc: &mut [__m256; T],
    scaled: &[__m256i; T],
    offsets: &[__m256; T],
    scale: FactoredLanes<'_>,
    offset: Option<FactoredLanes<'_>>,
    at: usize,
    acts: &[ActRow<'_>],
    first: usize,
) {
    let unit = _mm256_loadu_ps(scale.units.as_ptr().add(scale.layout.unit_of(at)));
    let offset_unit = offset.map(|o| _mm256_loadu_ps(o.units.as_ptr().add(o.layout.unit_of(at))));
    for j in 0..T {
        let d = _mm256_set1_ps(*acts[j].d.get_unchecked(first));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled[j]), _mm256_mul_ps(unit, d), acc[j]);
        if let Some(u) = offset_unit {
            acc[j] = _mm256_fmadd_ps(offsets[j], u, acc[j]);
        }
    }
}

impl<'a> FactoredLanes<'a> {
    /// A K-quant's factored scales and offsets of 8 interleaved rows (`group` weights a
    /// value, `cols` a row) with activations of one scale per super-block (Q8_K): the case
    /// of the tiles that sum a super-block's blocks in i32 (None: another case).
    pub(crate) fn super_blocks(
        scale: Scales<'a>,
        offset: Option<Scales<'a>>,
        group: usize,
        cols: usize,
        x: &QuantizedRows,
    ) -> Option<(Self, Option<Self>)> {
        let scale = Self::of(scale)?;
        let offset = match offset {
            Some(o) => Some(Self::of(o)?),
            None => None,
        };
        let super_block = scale.layout.per_unit() * group;
        let fits = x.format == ActFormat::Q8K
            && super_block == Q8K_BLOCK
            && cols.is_multiple_of(super_block)
            // Offsets are per 32 weights, as every format with them has them.
            && offset.is_none_or(|o| o.layout == scale.layout && group == ACT_BLOCK);
        fits.then_some((scale, offset))
    }

    /// Factored values of 8 interleaved rows as lanes (None: another storage or layout).
    pub(crate) fn of(s: Scales<'a>) -> Option<Self> {
        match s {
            Scales::Factored { units, k, layout } if layout.lanes() == 8 => Some(Self { units, k, layout }),
            _ => None,
        }
    }
}
