//! The formats added after the first three (Q5_0, Q5_1, Q2_K .. Q6_K) against the `gguf`
//! Python package (tests/data/make_quant_expected.py wrote quant_expected.bin), and the
//! K-quant quantizers by their properties: gguf 0.19.0 has no K-quant quantizer to compare
//! bytes with.

use kestrel_gguf::{dequantize, quantize, GgmlType};
use rand::{Rng, SeedableRng};

struct Case {
    ty: GgmlType,
    /// The float input of a quantization case.
    input: Option<Vec<f32>>,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Parses quant_expected.bin (format in the generator's docstring).
fn cases() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/quant_expected.bin");
    let data = std::fs::read(path).unwrap();
    let mut rest = data.as_slice();
    let mut take = |n: usize| {
        let (a, b) = rest.split_at(n);
        rest = b;
        (a, b.is_empty())
    };
    let mut out = Vec::new();
    loop {
        let name_len = take(1).0[0] as usize;
        let name = std::str::from_utf8(take(name_len).0).unwrap().to_string();
        let ty = *GgmlType::ALL.iter().find(|t| t.name() == name).unwrap();
        let kind = take(1).0[0];
        let n = u32::from_le_bytes(take(4).0.try_into().unwrap()) as usize;
        let n_bytes = ty.row_bytes(n as u64).unwrap() as usize;
        let input = (kind == 1).then(|| f32s(take(4 * n).0));
        let bytes = take(n_bytes).0.to_vec();
        let (values, end) = take(4 * n);
        out.push(Case { ty, input, bytes, values: f32s(values) });
        if end {
            return out;
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const NEW_TYPES: [GgmlType; 7] =
    [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Every new type's dequantization of random blocks is bit-equal to gguf's numpy code.
#[test]
fn dequantize_matches_gguf_python() {
    let cases = cases();
    for ty in NEW_TYPES {
        let case = cases.iter().find(|c| c.ty == ty && c.input.is_none()).unwrap_or_else(|| panic!("no {ty} case"));
        let mut out = vec![0f32; case.values.len()];
        dequantize(ty, &case.bytes, &mut out).unwrap();
        assert_eq!(bits(&out), bits(&case.values), "{ty}");
    }
}

/// Q5_0 and Q5_1 quantize to exactly gguf's bytes (which follow ggml's reference quantizer).
#[test]
fn quantize_matches_gguf_python() {
    let mut checked = 0;
    for case in cases() {
        let Some(input) = &case.input else { continue };
        let q = quantize(case.ty, input).unwrap();
        assert_eq!(q, case.bytes, "{}", case.ty);
        let mut out = vec![0f32; input.len()];
        dequantize(case.ty, &q, &mut out).unwrap();
        assert_eq!(bits(&out), bits(&case.values), "{}", case.ty);
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// (type, levels - 1, half a step of the quantized sub-block minimum relative to the largest
/// magnitude): Q2_K's mins have 4 bits, Q4_K's and Q5_K's 6 bits. Q3_K and Q6_K have no
/// minimum: their levels are symmetric around zero.
const K_QUANTS: [(GgmlType, f32, Option<f32>); 5] = [
    (GgmlType::Q2_K, 3.0, Some(1.0 / 30.0)),
    (GgmlType::Q3_K, 7.0, None),
    (GgmlType::Q4_K, 15.0, Some(1.0 / 126.0)),
    (GgmlType::Q5_K, 31.0, Some(1.0 / 126.0)),
    (GgmlType::Q6_K, 63.0, None),
];

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize(ty, x).unwrap();
    assert_eq!(q.len() as u64, ty.row_bytes(x.len() as u64).unwrap());
    let mut y = vec![f32::NAN; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

/// The interval a K-quant super-block's levels must cover: [-amax, amax] for the symmetric
/// formats; [min, max] widened to include zero for the others (ggml never uses a positive
/// minimum).
fn span(x: &[f32], symmetric: bool) -> f32 {
    let max = x.iter().fold(0f32, |m, &v| m.max(v));
    let min = x.iter().fold(0f32, |m, &v| m.min(v));
    if symmetric {
        2.0 * max.max(-min)
    } else {
        max - min
    }
}

/// ggml's K-quant quantizers search for least-squares scales, so no closed-form error bound
/// exists; the bound used is one step of the whole super-block's span (`span`) /
/// (levels - 1), plus half a step of the quantized minimum. Rounding to the nearest level costs half a step
/// of a sub-block's own (smaller or equal) step; the fit may clip a sub-block's extremes,
/// which measured at most 0.9 step over many random blocks. Layout, packing or scale bugs give
/// errors of the order of the range itself.
/// Magnitudes stay where the f16 super-block scales are normal numbers (their subnormal
/// rounding is absolute and would dominate).
#[test]
fn k_quant_round_trip_error_is_within_one_step_of_the_span() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for case in 0..300 {
        let scale = 10f32.powi(rng.random_range(-2..4));
        let x: Vec<f32> = (0..256 * 2)
            .map(|i| match case % 5 {
                // Outliers: every 37th value 8 times larger.
                0 if i % 37 == 0 => rng.random_range(-8.0..8.0) * scale,
                // Negative only.
                1 => -rng.random_range(0.1..1.0) * scale,
                // Constant sub-blocks of 64.
                2 => ((i / 64) as f32 - 3.5) * scale,
                _ => rng.random_range(-1.0..1.0) * scale,
            })
            .collect();
        for (ty, steps, min_error) in K_QUANTS {
            let y = round_trip(ty, &x);
            for (b, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let bound = span(xs, min_error.is_none()) / steps + amax * min_error.unwrap_or(0.0);
                for (a, b_) in xs.iter().zip(ys) {
                    assert!((a - b_).abs() <= bound, "{ty} case {case} block {b}: {a} vs {b_}, bound {bound}");
                }
            }
        }
    }
}

#[test]
fn k_quant_special_blocks() {
    let zero = [0f32; 256];
    let constant = [-0.75f32; 256];
    let tiny: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 1e-9).collect();
    for (ty, _, _) in K_QUANTS {
        assert_eq!(round_trip(ty, &zero), zero, "{ty}: a zero block stays zero");
        // A constant block is exact up to the f16 rounding of the scale that reproduces it.
        for v in round_trip(ty, &constant) {
            assert!((v + 0.75).abs() <= 0.75 * 2f32.powi(-10), "{ty}: {v}");
        }
        // Scales below the f16 range: nothing blows up.
        for (a, b) in tiny.iter().zip(round_trip(ty, &tiny)) {
            assert!(b.is_finite() && (a - b).abs() <= 2e-7, "{ty}: {a} vs {b}");
        }
    }
}

/// The largest sub-block scale code of each K-quant, and the (lowest, highest) level of its
/// sub-blocks, as signed multiples of the sub-block scale. Q2_K is left out: its search
/// minimizes absolute errors and re-fits a tiny nonzero minimum even for such blocks.
const K_QUANT_GRIDS: [(GgmlType, f32, i32, i32); 4] =
    [(GgmlType::Q3_K, 32.0, -4, 3), (GgmlType::Q4_K, 63.0, 0, 15), (GgmlType::Q5_K, 63.0, 0, 31), (GgmlType::Q6_K, 128.0, -32, 31)];

/// Idempotence, where it holds. ggml's search re-fits the scales of a dequantized block, so
/// an arbitrary dequantized block is not a fixed point (it changes for 10-75% of random
/// blocks, as in ggml itself). A block that is exactly representable with every sub-block
/// scale at its largest code, a power-of-two super-block scale (exact in f16) and every
/// sub-block spanning its whole level range is reproduced exactly: the first fit is already
/// perfect and no trial scale can improve on it.
#[test]
fn k_quant_exactly_representable_blocks_are_reproduced() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    for (ty, max_code, lo, hi) in K_QUANT_GRIDS {
        let sub = if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) { 32 } else { 16 };
        for k in -6..6 {
            let step = max_code * 2f32.powi(k);
            let x: Vec<f32> = (0..256 * 4)
                .map(|i| {
                    let level = match i % sub {
                        0 => lo,
                        1 => hi,
                        _ => rng.random_range(lo..=hi),
                    };
                    level as f32 * step
                })
                .collect();
            assert_eq!(bits(&round_trip(ty, &x)), bits(&x), "{ty} step {step}");
        }
    }
}

/// Inputs outside what ggml's quantizers expect (NaN, infinities, f32::MAX) give some bytes,
/// never a panic, and those bytes dequantize.
#[test]
fn hostile_inputs_do_not_panic() {
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -f32::MAX, 1e-45];
    for ty in NEW_TYPES {
        for &s in &specials {
            let x: Vec<f32> = (0..256).map(|i| if i % 5 == 0 { s } else { i as f32 }).collect();
            let q = quantize(ty, &x).unwrap();
            let mut y = vec![0f32; 256];
            dequantize(ty, &q, &mut y).unwrap();
        }
    }
}
