//! The attention tiles' 8 f32 lanes (`attention::lanes::Lanes`) in one AVX2 register.

use std::arch::x86_64::*;

use super::horizontal_sum;
use crate::attention::lanes::{Lanes, LANES};

/// One AVX2 register, with FMA and F16C. Made only inside `Task::run_avx2`, which runs after
/// the CPU reported all three, so the intrinsics below always have their instructions.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256);

impl Lanes for Avx2 {
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY (each block below): AVX2 and FMA are present (see the type).
        Self(unsafe { _mm256_setzero_ps() })
    }

    #[inline(always)]
    fn splat(x: f32) -> Self {
        Self(unsafe { _mm256_set1_ps(x) })
    }

    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        assert!(s.len() >= LANES, "lanes: a short load");
        // SAFETY: 8 values are readable (checked); AVX2 is present.
        Self(unsafe { _mm256_loadu_ps(s.as_ptr()) })
    }

    #[inline(always)]
    fn load_f16(s: &[u16]) -> Self {
        assert!(s.len() >= LANES, "lanes: a short load");
        // SAFETY: 8 halves (16 bytes) are readable (checked); F16C is present.
        Self(unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())) })
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        assert!(out.len() >= LANES, "lanes: a short store");
        // SAFETY: 8 values are writable (checked); AVX2 is present.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), self.0) }
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        Self(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
    }

    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        Self(unsafe { _mm256_mul_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn add(self, b: Self) -> Self {
        Self(unsafe { _mm256_add_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        Self(unsafe { _mm256_sub_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn max(self, b: Self) -> Self {
        Self(unsafe { _mm256_max_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn floor(self) -> Self {
        Self(unsafe { _mm256_floor_ps(self.0) })
    }

    #[inline(always)]
    fn pow2(self) -> Self {
        // SAFETY: AVX2 is present. n + 127 is the biased exponent of 2^n.
        Self(unsafe { _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(self.0), _mm256_set1_epi32(127)), 23)) })
    }

    #[inline(always)]
    fn sum(self) -> f32 {
        // SAFETY: AVX2 is present.
        unsafe { horizontal_sum(self.0) }
    }
}
