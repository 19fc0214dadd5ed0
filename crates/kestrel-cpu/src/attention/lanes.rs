//! The attention tiles' arithmetic: 8 f32 lanes (`Lanes`), in plain arrays here and in each
//! instruction set's registers under `arch`, and the values a KV cache stores (`CacheValue`).

/// Lanes of the accumulators (f32 SIMD: one AVX2 register, two of wasm's simd128).
pub(crate) const LANES: usize = 8;

/// A value as a KV cache stores it: f32, or f16 bits.
pub(crate) trait CacheValue: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    /// `s`'s first 8 values, in lanes.
    fn load<L: Lanes>(s: &[Self]) -> L;
}

impl CacheValue for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn load<L: Lanes>(s: &[Self]) -> L {
        L::load(s)
    }
}

impl CacheValue for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::rows::f16_to_f32(self)
    }

    #[inline(always)]
    fn load<L: Lanes>(s: &[Self]) -> L {
        L::load_f16(s)
    }
}

/// 8 f32 lanes of SIMD: the tiles' arithmetic, written once for every instruction set.
pub(crate) trait Lanes: Copy {
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    /// `s`'s first 8 values.
    fn load(s: &[f32]) -> Self;
    /// `s`'s first 8 values, f16 bits.
    fn load_f16(s: &[u16]) -> Self;
    /// Into `out`'s first 8 values.
    fn store(self, out: &mut [f32]);
    /// `self · b + c`, fused where the instruction set has it.
    fn mul_add(self, b: Self, c: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    fn add(self, b: Self) -> Self;
    fn sub(self, b: Self) -> Self;
    fn max(self, b: Self) -> Self;
    fn floor(self) -> Self;
    /// `2^n` of lanes holding whole numbers n in -126..=127.
    fn pow2(self) -> Self;
    fn sum(self) -> f32;

    /// Lane 0.
    #[inline(always)]
    fn first(self) -> f32 {
        let mut lanes = [0f32; LANES];
        self.store(&mut lanes);
        lanes[0]
    }

    /// The largest lane.
    #[inline(always)]
    fn max_lane(self) -> f32 {
        let mut lanes = [0f32; LANES];
        self.store(&mut lanes);
        lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
    }

    /// `e^x` for lanes x <= 0 (a softmax's scores less their maximum), within 2 units in the
    /// last place: Cephes' `expf`, `2^n · e^r` with `n = round(x · log2 e)` and `|r| <= ln2/2` by a
    /// polynomial. Below -87 it returns e^-87 (1.6e-38), nothing next to the maximum's weight 1.
    #[inline(always)]
    fn exp(self) -> Self {
        let x = self.max(Self::splat(-87.0));
        let n = x.mul_add(Self::splat(std::f32::consts::LOG2_E), Self::splat(0.5)).floor();
        // ln 2 in two parts, the first exact in a few bits, so that n · it is exact.
        let r = n.mul_add(Self::splat(-0.693_359_4), x);
        let r = n.mul_add(Self::splat(2.121_944_4e-4), r);
        let mut p = Self::splat(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            p = p.mul_add(r, Self::splat(c));
        }
        p.mul(r.mul(r)).add(r).add(Self::splat(1.0)).mul(n.pow2())
    }
}

/// Plain arrays, for targets without the SIMD below.
#[derive(Clone, Copy)]
pub(crate) struct Portable([f32; LANES]);

impl Lanes for Portable {
    #[inline(always)]
    fn zero() -> Self {
        Self([0.0; LANES])
    }

    #[inline(always)]
    fn splat(x: f32) -> Self {
        Self([x; LANES])
    }

    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut lanes = [0.0; LANES];
        lanes.copy_from_slice(&s[..LANES]);
        Self(lanes)
    }

    #[inline(always)]
    fn load_f16(s: &[u16]) -> Self {
        let mut lanes = [0.0; LANES];
        for (x, &h) in lanes.iter_mut().zip(&s[..LANES]) {
            *x = crate::rows::f16_to_f32(h);
        }
        Self(lanes)
    }

    #[inline(always)]
    fn store(self, out: &mut [f32]) {
        out[..LANES].copy_from_slice(&self.0);
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        let mut lanes = c.0;
        for ((x, a), b) in lanes.iter_mut().zip(self.0).zip(b.0) {
            *x += a * b;
        }
        Self(lanes)
    }

    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        self.zip(b, |a, b| a * b)
    }

    #[inline(always)]
    fn add(self, b: Self) -> Self {
        self.zip(b, |a, b| a + b)
    }

    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        self.zip(b, |a, b| a - b)
    }

    #[inline(always)]
    fn max(self, b: Self) -> Self {
        self.zip(b, f32::max)
    }

    #[inline(always)]
    fn floor(self) -> Self {
        self.zip(self, |a, _| a.floor())
    }

    #[inline(always)]
    fn pow2(self) -> Self {
        self.zip(self, |n, _| f32::from_bits(((n as i32 + 127) as u32) << 23))
    }

    #[inline(always)]
    fn sum(self) -> f32 {
        self.0.iter().sum()
    }
}

impl Portable {
    #[inline(always)]
    fn zip(self, b: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        let mut lanes = self.0;
        for (x, b) in lanes.iter_mut().zip(b.0) {
            *x = f(*x, b);
        }
        Self(lanes)
    }
}
