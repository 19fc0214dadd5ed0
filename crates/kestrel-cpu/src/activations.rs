//! Activations quantized to 8 bits, as llama.cpp quantizes them before an integer dot product:
//! Q8_0's blocks of 32 (scale `amax / 127`, stored as f16) for the 32-weight formats, Q8_K's
//! blocks of 256 (scale `max / -127` with the sign of the largest value, f32, levels rounded to
//! nearest even) for the K-quants. Either way each 32 values carry their scale and each 16 the
//! scaled sum of their levels, which an offset (`min`) of the weights multiplies.

use kestrel_gguf::quant::INT_GROUP;

use crate::ACT_BLOCK;

/// Which of llama.cpp's activation formats a weight format pairs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    Q8_0,
    Q8K,
}

/// `n` rows of `cols` values as 8-bit levels: value ≈ `d[b] * q`, block `b` of 32.
pub(crate) struct QuantizedRows {
    /// Which format: the AVX2 tiles that sum a super-block in i32 need Q8_K's one scale a 256.
    #[cfg_attr(not(target_arch = "x86_64"), expect(dead_code, reason = "only the AVX2 tiles read it"))]
    pub(crate) format: ActFormat,
    pub(crate) q: Vec<i8>,
    /// One scale per 32 values.
    pub(crate) d: Vec<f32>,
    /// `Σ q` per 16 values (at most 16 · 128 in magnitude), which the tiles of 6-bit levels
    /// kept with a bias take off in integers.
    pub(crate) level_sums16: Vec<i16>,
    /// `d * Σ q` per 16 values and per 32.
    pub(crate) sums16: Vec<f32>,
    pub(crate) sums32: Vec<f32>,
}

/// Values per block of Q8_K.
pub(crate) const Q8K_BLOCK: usize = 256;

impl QuantizedRows {
    /// `x` is whole rows of a multiple of 32 values (of 256 for Q8_K), which every quantized
    /// weight format's row length is.
    pub(crate) fn new(x: &[f32], format: ActFormat) -> Self {
        let mut out = Self {
            format,
            q: vec![0; x.len()],
            d: Vec::with_capacity(x.len() / ACT_BLOCK),
            level_sums16: Vec::new(),
            sums16: Vec::new(),
            sums32: Vec::new(),
        };
        let block = match format {
            ActFormat::Q8_0 => ACT_BLOCK,
            ActFormat::Q8K => Q8K_BLOCK,
        };
        for (xs, qs) in x.chunks(block).zip(out.q.chunks_mut(block)) {
            let d = match format {
                ActFormat::Q8_0 => quantize_q8_0(xs, qs),
                ActFormat::Q8K => quantize_q8_k(xs, qs),
            };
            out.d.extend(std::iter::repeat_n(d, xs.len() / ACT_BLOCK));
        }
        // 16 levels of at most 128 in magnitude: within i16.
        out.level_sums16 = out.q.chunks(INT_GROUP).map(|q| q.iter().map(|&q| i16::from(q)).sum()).collect();
        let halves = out.level_sums16.chunks(ACT_BLOCK / INT_GROUP);
        out.sums16 = out.level_sums16.iter().zip(out.d.iter().flat_map(|&d| [d, d])).map(|(&s, d)| d * f32::from(s)).collect();
        out.sums32 = halves.zip(&out.d).map(|(s, d)| d * s.iter().map(|&s| f32::from(s)).sum::<f32>()).collect();
        out
    }
}

/// ggml-cpu's x86 `quantize_row_q8_0` (the one its AVX2 build runs): levels `x · 127 / amax`
/// rounded to nearest even, the scale `amax / 127` kept as f16.
fn quantize_q8_0(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = nearest_even(v * id) as i8;
    }
    half::f16::from_f32(amax / 127.0).to_f32()
}

/// ggml's `quantize_row_q8_K_ref`.
fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = nearest_even(iscale * v).min(127.0) as i8;
    }
    1.0 / iscale
}

/// `x` rounded to the nearest integer, ties to even, for |x| < 2^22 (activation levels are
/// within ±127): adding 1.5·2^23 leaves no fraction bits, so the hardware's rounding mode does
/// it (ggml's `nearest_int`), in plain adds the compiler vectorizes, where `round_ties_even`
/// calls libm's `rintf` on x86-64 without SSE4.1 in the baseline.
fn nearest_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}
