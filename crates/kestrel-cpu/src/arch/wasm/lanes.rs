//! The attention tiles' 8 f32 lanes (`attention::lanes::Lanes`) in two of wasm's 128-bit
//! registers.

use core::arch::wasm32::{
    f32x4_add, f32x4_floor, f32x4_max, f32x4_mul, f32x4_sub, i32x4_add, i32x4_shl, i32x4_splat, i32x4_trunc_sat_f32x4, v128,
};

use crate::attention::lanes::{Lanes, LANES};

/// Two of wasm's 128-bit registers (every wasm build of this crate has simd128).
#[derive(Clone, Copy)]
pub(crate) struct Simd128([v128; 2]);

impl Simd128 {
    #[inline(always)]
    fn zip(self, b: Self, f: impl Fn(v128, v128) -> v128) -> Self {
        Self([f(self.0[0], b.0[0]), f(self.0[1], b.0[1])])
    }
}

impl Lanes for Simd128 {
    #[inline(always)]
    fn zero() -> Self {
        Self::splat(0.0)
    }

    #[inline(always)]
    fn splat(x: f32) -> Self {
        let v = core::arch::wasm32::f32x4_splat(x);
        Self([v, v])
    }

    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        assert!(s.len() >= LANES, "lanes: a short load");
        // SAFETY: 8 values are readable (checked); wasm loads need no alignment.
        unsafe { Self([core::arch::wasm32::v128_load(s.as_ptr().cast()), core::arch::wasm32::v128_load(s.as_ptr().add(4).cast())]) }
    }

    /// wasm has no f16 conversion: `f16_to_f32`'s bit moves in integer lanes. Normal halves
    /// rebias their exponent (+112 << 23); zeros and subnormals are their mantissa times
    /// 2^-24; infinities and NaNs keep an all-ones exponent.
    #[inline(always)]
    fn load_f16(s: &[u16]) -> Self {
        use core::arch::wasm32::*;
        assert!(s.len() >= LANES, "lanes: a short load");
        // SAFETY: 8 halves (16 bytes) are readable (checked).
        let h = unsafe { v128_load(s.as_ptr().cast()) };
        let convert = |h: v128| {
            let sign = i32x4_shl(v128_and(h, i32x4_splat(0x8000)), 16);
            let magnitude = v128_and(h, i32x4_splat(0x7fff));
            let normal = i32x4_add(i32x4_shl(magnitude, 13), i32x4_splat(0x3800_0000));
            let special = i32x4_add(normal, i32x4_splat(0x3800_0000));
            let tiny = f32x4_mul(f32x4_convert_i32x4(magnitude), f32x4_splat(1.0 / 16_777_216.0));
            let value = v128_bitselect(tiny, normal, i32x4_lt(magnitude, i32x4_splat(0x0400)));
            let value = v128_bitselect(special, value, i32x4_ge(magnitude, i32x4_splat(0x7c00)));
            v128_or(value, sign)
        };
        Self([convert(u32x4_extend_low_u16x8(h)), convert(u32x4_extend_high_u16x8(h))])
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        assert!(out.len() >= LANES, "lanes: a short store");
        // SAFETY: 8 values are writable (checked).
        unsafe {
            core::arch::wasm32::v128_store(out.as_mut_ptr().cast(), self.0[0]);
            core::arch::wasm32::v128_store(out.as_mut_ptr().add(4).cast(), self.0[1]);
        }
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        self.mul(b).add(c)
    }

    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        self.zip(b, |a, b| f32x4_mul(a, b))
    }

    #[inline(always)]
    fn add(self, b: Self) -> Self {
        self.zip(b, |a, b| f32x4_add(a, b))
    }

    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        self.zip(b, |a, b| f32x4_sub(a, b))
    }

    #[inline(always)]
    fn max(self, b: Self) -> Self {
        self.zip(b, |a, b| f32x4_max(a, b))
    }

    #[inline(always)]
    fn floor(self) -> Self {
        self.zip(self, |a, _| f32x4_floor(a))
    }

    #[inline(always)]
    fn pow2(self) -> Self {
        self.zip(self, |n, _| i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23))
    }

    #[inline(always)]
    fn sum(self) -> f32 {
        let mut lanes = [0f32; LANES];
        self.store(&mut lanes);
        lanes.iter().sum()
    }
}
