//! Blocks as small integers with a scale and an offset per 16 weights: `w = scale * q + min`.
//! Every format the GPU runs decodes this way (ggml's own dequantizers compute exactly these
//! products), so a CPU kernel can multiply the integers by 8-bit activations and apply the
//! scales once per 16, as llama.cpp's CPU dot products do.

use super::QK_K;
use crate::error::GgufError;
use crate::types::GgmlType;

/// Weights sharing one scale and offset.
pub const INT_GROUP: usize = 16;

/// One block of `E` weights in `G = E / 16` groups: weight `e` is
/// `scale[e / 16] * q[e] + min[e / 16]` (without the addition when `min` is None), computed in
/// f32 in that order, bit-exact with the format's dequantizer.
pub(crate) struct IntBlock<const E: usize, const G: usize> {
    pub q: [i8; E],
    pub scale: [f32; G],
    pub min: Option<[f32; G]>,
}

impl<const E: usize, const G: usize> IntBlock<E, G> {
    pub(crate) fn new() -> Self {
        Self { q: [0; E], scale: [0.0; G], min: None }
    }

    /// The block's f32 weights.
    pub(crate) fn expand(&self, out: &mut [f32; E]) {
        let groups = out.chunks_exact_mut(INT_GROUP).zip(self.q.chunks_exact(INT_GROUP)).zip(self.scale);
        for (g, ((out, q), scale)) in groups.enumerate() {
            let min = self.min.map(|m| m[g]);
            for (o, &q) in out.iter_mut().zip(q) {
                let scaled = f32::from(q) * scale;
                *o = match min {
                    Some(m) => scaled + m,
                    None => scaled,
                };
            }
        }
    }
}

/// A tensor of the formats `int_groups` reads, as integers: one `q` per weight, a scale per 16
/// weights and, for the formats with offsets (Q4_1, Q5_1, Q4_K, Q5_K), an offset per 16.
#[derive(Clone, Debug, PartialEq)]
pub struct IntGroups {
    pub q: Vec<i8>,
    pub scale: Vec<f32>,
    pub min: Option<Vec<f32>>,
}

/// The integers, scales and offsets of `n` weights stored as `bytes` of type `ty` (the
/// quantized types the GPU runs: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
pub fn int_groups(ty: GgmlType, bytes: &[u8], n: usize) -> Result<IntGroups, GgufError> {
    use super::{q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
    super::check_data_len(ty, bytes, n, "integer decoding")?;
    let mut out = IntGroups { q: Vec::with_capacity(n), scale: Vec::with_capacity(n / INT_GROUP), min: None };
    match ty {
        GgmlType::Q8_0 => collect(bytes, &mut out, q8_0::int_block),
        GgmlType::Q4_0 => collect(bytes, &mut out, q4_0::int_block),
        GgmlType::Q4_1 => collect(bytes, &mut out, q4_1::int_block),
        GgmlType::Q5_0 => collect(bytes, &mut out, q5_0::int_block),
        GgmlType::Q5_1 => collect(bytes, &mut out, q5_1::int_block),
        GgmlType::Q4_K => collect(bytes, &mut out, q4_k::int_block),
        GgmlType::Q5_K => collect(bytes, &mut out, q5_k::int_block),
        GgmlType::Q6_K => collect(bytes, &mut out, q6_k::int_block),
        _ => return Err(GgufError::UnsupportedType { ty, operation: "integer decoding" }),
    }
    Ok(out)
}

/// A K-quant super-block's scales and offsets as the format keeps them: small integers of the
/// block's units, per group of 16 weights (as `int_groups` has them). Scale g is
/// `units[0] · scale[g]` and offset g `units[1] · min[g]`, the very f32 products `int_groups`
/// gives (an f16 times an integer of at most 8 bits is exact, and `(-dmin) · m` is `-(dmin · m)`):
/// units `[d, -dmin]` with 6-bit `sc` and `m` for Q4_K and Q5_K, `[d, 0]` with Q6_K's 8-bit
/// signed `sc` (and mins 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuperBlockFactors {
    pub units: [f32; 2],
    pub scale: [i8; QK_K / INT_GROUP],
    pub min: [i8; QK_K / INT_GROUP],
}

/// The factors of each super-block of `n` weights stored as `bytes` of type `ty`; None for the
/// formats that are not K-quants.
pub fn super_block_factors(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Option<Vec<SuperBlockFactors>>, GgufError> {
    use super::{f16_at, kquant::scale_min_k4, q4_k, q5_k, q6_k};
    super::check_data_len(ty, bytes, n, "super-block factors")?;
    /// Q4_K and Q5_K keep d, dmin and the packed 6-bit scales and mins at the same offsets.
    fn scale_min<const N: usize>(b: &[u8; N]) -> SuperBlockFactors {
        let packed = q4_k::scale_bytes(b);
        let mut f = SuperBlockFactors { units: [f16_at(b, q4_k::OFFSET_D), -f16_at(b, q4_k::OFFSET_DMIN)], scale: [0; 16], min: [0; 16] };
        for (g, (s, m)) in f.scale.iter_mut().zip(&mut f.min).enumerate() {
            let (sc, mn) = scale_min_k4(g / 2, &packed);
            // 6 bits: within i8.
            (*s, *m) = (sc as i8, mn as i8);
        }
        f
    }
    let factors = match ty {
        GgmlType::Q4_K => super::blocks::<{ q4_k::BLOCK_BYTES }>(bytes).map(scale_min).collect(),
        GgmlType::Q5_K => super::blocks::<{ q5_k::BLOCK_BYTES }>(bytes).map(scale_min).collect(),
        GgmlType::Q6_K => super::blocks::<{ q6_k::BLOCK_BYTES }>(bytes)
            .map(|b| {
                let mut scale = [0i8; 16];
                for (s, &byte) in scale.iter_mut().zip(&b[q6_k::OFFSET_SCALES..q6_k::OFFSET_D]) {
                    *s = byte as i8;
                }
                SuperBlockFactors { units: [f16_at(b, q6_k::OFFSET_D), 0.0], scale, min: [0; 16] }
            })
            .collect(),
        _ => return Ok(None),
    };
    Ok(Some(factors))
}

fn collect<const N: usize, const E: usize, const G: usize>(bytes: &[u8], out: &mut IntGroups, block: fn(&[u8; N]) -> IntBlock<E, G>) {
    for b in super::blocks::<N>(bytes).map(block) {
        out.q.extend_from_slice(&b.q);
        out.scale.extend_from_slice(&b.scale);
        if let Some(m) = b.min {
            out.min.get_or_insert_with(Vec::new).extend_from_slice(&m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integers, scales and offsets give back the dequantizer's values exactly, for every
    /// format, on blocks quantized from values with a wide spread of magnitudes and signs.
    #[test]
    fn int_groups_expand_to_the_dequantized_values() {
        let n = 512;
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.0037 * (1.0 + (i % 5) as f32)).collect();
        for ty in
            [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
        {
            let bytes = super::super::quantize(ty, &values).unwrap();
            let mut expected = vec![0.0; n];
            super::super::dequantize(ty, &bytes, &mut expected).unwrap();
            let g = int_groups(ty, &bytes, n).unwrap();
            assert_eq!(g.q.len(), n, "{ty}");
            assert_eq!(g.scale.len(), n / INT_GROUP, "{ty}");
            let has_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K);
            assert_eq!(g.min.is_some(), has_min, "{ty}");
            for (e, want) in expected.iter().enumerate() {
                let scaled = f32::from(g.q[e]) * g.scale[e / INT_GROUP];
                let got = g.min.as_ref().map_or(scaled, |m| scaled + m[e / INT_GROUP]);
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} element {e}: {got} vs {want}");
            }
            // The K-quants' scales and offsets are whole multiples of their super-block's units.
            if let Some(factors) = super_block_factors(ty, &bytes, n).unwrap() {
                assert_eq!(factors.len(), n / 256, "{ty}");
                let offsets = g.min.clone().unwrap_or_else(|| vec![0.0; g.scale.len()]);
                for (i, (&scale, &offset)) in g.scale.iter().zip(&offsets).enumerate() {
                    let f = &factors[i / (256 / INT_GROUP)];
                    let (k_scale, k_min) = (f.scale[i % 16], f.min[i % 16]);
                    // Bit for bit: the kernels multiply unit by integer where int_groups had the value.
                    assert_eq!((f.units[0] * f32::from(k_scale)).to_bits(), scale.to_bits(), "{ty} group {i}: scale");
                    assert_eq!((f.units[1] * f32::from(k_min)).to_bits(), offset.to_bits(), "{ty} group {i}: offset");
                    assert!((0..=63).contains(&k_min), "{ty} group {i}: min {k_min}");
                }
            } else {
                assert!(!matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K), "{ty} has no units");
            }
        }
        assert!(int_groups(GgmlType::Q2_K, &[0; 84], 256).is_err());
        assert!(int_groups(GgmlType::Q4_0, &[0; 17], 32).is_err());
    }
}
