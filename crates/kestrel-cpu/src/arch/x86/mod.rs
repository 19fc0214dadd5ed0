//! x86-64's kernels: AVX2 with FMA and F16C (every x86-64 CPU since 2013 has all three), with
//! AVX-VNNI's or AVX512-VNNI's `dpbusd` where the CPU has them, each chosen at run time by the
//! portable code that calls them. Helpers that more than one kernel uses live here.

pub(crate) mod dot;
pub(crate) mod f32_dot;
pub(crate) mod interleaved;
pub(crate) mod interleaved_bytes;
pub(crate) mod lanes;
pub(crate) mod scales;
pub(crate) mod tiles;

use std::arch::x86_64::*;

/// Whether the CPU has AVX2, FMA and F16C: what every x86-64 kernel here needs.
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Whether the CPU has AVX-VNNI's 256-bit `dpbusd` (`dot`'s second tile set).
pub(crate) fn has_avx_vnni() -> bool {
    is_x86_feature_detected!("avxvnni")
}

/// Whether the CPU has AVX512-VNNI's `dpbusd`, on 256-bit vectors (AVX512VL) and 512-bit ones
/// (with AVX512BW's byte and 16-bit lanes, which every CPU with AVX512-VNNI has): the
/// interleaved K-quant tiles then sum 4 byte products into i32 in one instruction where AVX2
/// takes `maddubs` and an add (and a widening `madd` a block).
pub(crate) fn has_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
}

/// How far ahead of the block being read the levels are fetched into the cache, in bytes. A
/// decode step streams each weight once, so its speed is the memory's; the hardware
/// prefetchers stop at every 4 KiB page and ramp up again, which left a decode step waiting
/// on its loads (a 1B model's step ran at about 5 GB/s a core); a matrix's rows lie one after
/// another, so this runs on into the next rows.
const PREFETCH_BYTES: usize = 4096;

/// Asks for the cache lines `PREFETCH_BYTES` past the `bytes` (a multiple of 64) at `at` (past
/// the levels' end it is a no-op: a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch_ahead(at: *const u8, bytes: usize) {
    for line in 0..bytes / 64 {
        // SAFETY: a prefetch reads nothing and never faults, whatever the address; SSE, which
        // every x86-64 CPU has, is enough.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_BYTES + 64 * line).cast()) };
    }
}

/// The sum of the 8 lanes: the halves added, then pairs, then the last two.
///
/// # Safety
/// AVX is present (inlined into callers that enable AVX2).
#[inline(always)]
pub(crate) unsafe fn horizontal_sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}
