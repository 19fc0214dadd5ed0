//! Quant formats: hand-checked blocks, round-trip bounds, and agreement with the `gguf` Python
//! package on the default model.

mod common;

use kestrel_gguf::{dequantize, parse_header, quantize, GgmlType, GgufError};
use rand::{Rng, SeedableRng};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Q8_0, amax 254 so d = 254 / 127 = 2.0 exactly (f16 0x4000) and id = 0.5. The odd values
/// land on .5 after scaling: roundf rounds them away from zero (-14.5 -> -15, 15.5 -> 16).
#[test]
fn q8_0_hand_checked_block() {
    let x: Vec<f32> = std::iter::once(254.0).chain((1..32).map(|j| (2 * j - 31) as f32)).collect();
    let mut expected = vec![0x00, 0x40, 127];
    expected.extend((1..32).map(|j: i32| (if j <= 15 { j - 16 } else { j - 15 }) as i8 as u8));
    let q = quantize(GgmlType::Q8_0, &x).unwrap();
    assert_eq!(q, expected);
    assert_eq!(q, hex("00407ff1f2f3f4f5f6f7f8f9fafbfcfdfeff0102030405060708090a0b0c0d0e0f10"));
    let mut back = [0f32; 32];
    dequantize(GgmlType::Q8_0, &q, &mut back).unwrap();
    assert_eq!(back[0], 254.0);
    assert_eq!(back[1], -30.0); // q = -15
    assert_eq!(back[31], 32.0); // q = 16
}

/// Q4_0, x[j] = 16 - j: the largest magnitude is +16, so d = 16 / -8 = -2 (f16 0xC000),
/// id = -0.5 and q[j] = trunc(8.5 - x / 2) = min(15, (j + 1) / 2). Byte j packs q[j] (low)
/// with q[j + 16] (high).
#[test]
fn q4_0_hand_checked_block() {
    let x: Vec<f32> = (0..32).map(|j| (16 - j) as f32).collect();
    let q_of = |j: u8| j.div_ceil(2).min(15);
    let mut expected = vec![0x00, 0xC0];
    expected.extend((0..16).map(|j| q_of(j) | (q_of(j + 16) << 4)));
    let q = quantize(GgmlType::Q4_0, &x).unwrap();
    assert_eq!(q, expected);
    assert_eq!(q, hex("00c0809191a2a2b3b3c4c4d5d5e6e6f7f7f8"));
    let mut back = [0f32; 32];
    dequantize(GgmlType::Q4_0, &q, &mut back).unwrap();
    assert_eq!(&back[..4], &[16.0, 14.0, 14.0, 12.0]); // (q - 8) * -2
    assert_eq!(back[31], -14.0); // q clamped to 15
}

/// Q4_1, x[j] = j: min 0, max 31, d = 31 / 15 = 2.0666.. -> f16 0x4022 (2.06640625), m = 0,
/// q[j] = trunc(j * (15 / 31) + 0.5): 0 0 1 1 2 2 ... 7 7 | 8 8 9 9 ... 15 15.
#[test]
fn q4_1_hand_checked_block() {
    let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
    let mut expected = vec![0x22, 0x40, 0x00, 0x00];
    expected.extend((0..16u8).map(|j| (j / 2) | ((8 + j / 2) << 4)));
    let q = quantize(GgmlType::Q4_1, &x).unwrap();
    assert_eq!(q, expected);
    assert_eq!(q, hex("2240000080809191a2a2b3b3c4c4d5d5e6e6f7f7"));
    let mut back = [0f32; 32];
    dequantize(GgmlType::Q4_1, &q, &mut back).unwrap();
    let d = half::f16::from_bits(0x4022).to_f32(); // 2.06640625
    assert_eq!(back[2], d);
    assert_eq!(back[31], 15.0 * d);
}

#[test]
fn zero_block_has_zero_scale() {
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
        let q = quantize(ty, &[0.0; 32]).unwrap();
        let mut back = [1f32; 32];
        dequantize(ty, &q, &mut back).unwrap();
        assert_eq!(back, [0.0; 32], "{ty}");
    }
}

#[test]
fn round_trip_within_format_error_bound() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..200 {
        let scale = 10f32.powi(rng.random_range(-3..3));
        let x: Vec<f32> = (0..32 * 4).map(|_| rng.random_range(-1.0..1.0) * scale).collect();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::F32] {
            let q = quantize(ty, &x).unwrap();
            let mut back = vec![0f32; x.len()];
            dequantize(ty, &q, &mut back).unwrap();
            for (block, (xs, ys)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let range = xs.iter().fold(f32::MIN, |m, &v| m.max(v)) - xs.iter().fold(f32::MAX, |m, &v| m.min(v));
                let min = xs.iter().fold(f32::MAX, |m, &v| m.min(v));
                // Half a quantization step, plus the f16 rounding of the scale carried to the
                // largest code (and of the minimum for Q4_1). Tiny scales are f16 subnormals,
                // whose rounding error is absolute.
                let f16_err = |v: f32| (v.abs() * 2f32.powi(-11)).max(2f32.powi(-25));
                let bound = match ty {
                    GgmlType::Q8_0 => amax / 127.0 * 0.5 + 127.0 * f16_err(amax / 127.0),
                    GgmlType::Q4_0 => amax / 8.0 + 8.0 * f16_err(amax / 8.0),
                    GgmlType::Q4_1 => range / 15.0 * 0.5 + 15.0 * f16_err(range / 15.0) + f16_err(min),
                    GgmlType::F16 => f16_err(amax),
                    _ => 0.0,
                };
                for (a, b) in xs.iter().zip(ys) {
                    assert!((a - b).abs() <= bound, "{ty} block {block}: {a} vs {b}, bound {bound}");
                }
            }
        }
    }
}

#[test]
fn f16_conversion_is_exact_for_every_pattern() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let mut values = vec![0f32; 65536];
    dequantize(GgmlType::F16, &all, &mut values).unwrap();
    let back = quantize(GgmlType::F16, &values).unwrap();
    for (bits, (a, b)) in all.chunks(2).zip(back.chunks(2)).enumerate() {
        if values[bits].is_nan() {
            assert!(half::f16::from_le_bytes([b[0], b[1]]).is_nan());
        } else {
            assert_eq!(a, b, "f16 pattern {bits:#06x}");
        }
    }
    // Rounding to nearest even: 1 + 2^-11 is halfway between 1 and the next f16.
    assert_eq!(quantize(GgmlType::F16, &[1.0 + 2f32.powi(-11)]).unwrap(), [0x00, 0x3C]);
    assert_eq!(quantize(GgmlType::F16, &[1.0 + 3.0 * 2f32.powi(-11)]).unwrap(), [0x02, 0x3C]);
}

#[test]
fn size_and_type_errors() {
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0f32; 256]),
        Err(GgufError::UnsupportedType { ty: GgmlType::IQ2_XXS, .. })
    ));
    assert!(matches!(quantize(GgmlType::Q8_K, &[0.0; 256]), Err(GgufError::UnsupportedType { .. })));
    assert!(matches!(quantize(GgmlType::Q6_K, &[0.0; 255]), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(dequantize(GgmlType::Q4_K, &[0; 143], &mut [0f32; 256]), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(dequantize(GgmlType::Q8_0, &[0; 33], &mut out), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(dequantize(GgmlType::Q8_0, &[0; 34], &mut out[..31]), Err(GgufError::SizeMismatch { .. })));
    assert!(matches!(quantize(GgmlType::Q4_1, &[0.0; 33]), Err(GgufError::SizeMismatch { .. })));
}

/// First 64 values of some tensors, as the `gguf` Python package dequantizes them
/// (tests/data/make_expected_dequant.py).
#[test]
fn real_model_dequantize_matches_gguf_python() {
    let bytes = common::model_bytes();
    let h = parse_header(bytes).unwrap();
    let expected = include_str!("data/expected_dequant.txt");
    let mut checked = 0;
    for line in expected.lines() {
        let mut fields = line.split_whitespace();
        let (name, ty) = (fields.next().unwrap(), fields.next().unwrap());
        let values: Vec<f32> = fields.map(|v| v.parse().unwrap()).collect();
        let index = h.tensors.iter().position(|t| t.name == name).unwrap();
        let t = &h.tensors[index];
        assert_eq!(t.ggml_type.name(), ty);
        let data = h.tensor_bytes(index, bytes).unwrap();
        let row_bytes = t.ggml_type.row_bytes(64).unwrap() as usize;
        let mut out = [0f32; 64];
        dequantize(t.ggml_type, &data[..row_bytes], &mut out).unwrap();
        assert_eq!(out.as_slice(), values.as_slice(), "{name}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}
