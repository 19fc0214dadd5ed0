//! The CPU products against f32 arithmetic on the same (dequantized) weights, within a bound
//! derived from the 8-bit rounding of the activations.

use kestrel_cpu::Matrix;
use kestrel_gguf::{quant, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

fn random(rng: &mut StdRng, n: usize, spread: f32) -> Vec<f32> {
    // Values of mixed magnitude, so blocks' scales differ: the kernels must not mix them up.
    (0..n).map(|i| rng.random_range(-1.0f32..1.0) * spread * (1.0 + (i / 32 % 7) as f32)).collect()
}

/// Rounding an activation block to 8 bits moves each value by at most half a level:
/// `amax / 254` for Q8_0 and Q8_K (both 127 levels a side), plus Q8_0's f16 scale's relative
/// rounding (2^-11) of `amax`; `|Σ w·(x - x̂)|` is then at most `Σ |w| · that`. The f32 sums
/// add at most a few units of rounding of `Σ |w·x|` (1e-5 of it covers a thousand terms).
fn bound(w_row: &[f32], x: &[f32], block: usize) -> f32 {
    let mut b = 0.0;
    for (ws, xs) in w_row.chunks(block).zip(x.chunks(block)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let step = amax / 254.0 + amax / 2048.0;
        b += ws.iter().map(|w| w.abs()).sum::<f32>() * step;
    }
    b + 1e-5 * w_row.iter().zip(x).map(|(w, x)| (w * x).abs()).sum::<f32>()
}

#[test]
fn products_match_f32_within_the_activation_rounding_bound() {
    let mut rng = StdRng::seed_from_u64(7);
    // 152 rows: the 4-bit formats' rows interleaved in groups of 8 where the machine has their
    // SIMD products; 150: rows one after another.
    for (ty, rows, cols) in TYPES.into_iter().flat_map(|ty| [(ty, 150, 512), (ty, 152, 512)]) {
        let bytes = quant::quantize(ty, &random(&mut rng, rows * cols, 0.05)).unwrap();
        let mut w = vec![0.0; rows * cols];
        quant::dequantize(ty, &bytes, &mut w).unwrap();
        let m = Matrix::from_ggml(ty, &bytes, rows, cols).unwrap();
        assert_eq!((m.rows(), m.cols()), (rows, cols));
        for n in [1, 5] {
            let x = random(&mut rng, n * cols, 1.0);
            let y = m.apply(&x);
            assert_eq!(y.len(), n * rows);
            let block = if ty.block_size() == 256 { 256 } else { 32 };
            for t in 0..n {
                let xt = &x[t * cols..][..cols];
                for r in 0..rows {
                    let w_row = &w[r * cols..][..cols];
                    let want: f32 = w_row.iter().zip(xt).map(|(a, b)| f64::from(a * b)).sum::<f64>() as f32;
                    let got = y[t * rows + r];
                    // F16 and F32 weights multiply f32 activations: only the sums' rounding.
                    let tol = if matches!(ty, GgmlType::F32 | GgmlType::F16) {
                        1e-5 * w_row.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum::<f32>()
                    } else {
                        bound(w_row, xt, block)
                    };
                    assert!((got - want).abs() <= tol, "{ty} n={n} token {t} row {r}: {got} vs {want} (bound {tol})");
                }
            }
        }
        // The gather reads the dequantizer's values exactly.
        for r in [0, 77, rows - 1] {
            assert_eq!(m.row(r), w[r * cols..][..cols].to_vec(), "{ty} row {r}");
        }
    }
}

#[test]
fn split_rows_keeps_each_half_of_the_product() {
    let mut rng = StdRng::seed_from_u64(8);
    let (rows, cols) = (96, 256);
    for ty in [GgmlType::Q4_K, GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32] {
        let bytes = quant::quantize(ty, &random(&mut rng, rows * cols, 0.1)).unwrap();
        let whole = Matrix::from_ggml(ty, &bytes, rows, cols).unwrap().apply(&random(&mut StdRng::seed_from_u64(1), cols, 1.0));
        let x = random(&mut StdRng::seed_from_u64(1), cols, 1.0);
        // At the edge of a group of 8 interleaved rows, and inside one.
        for at in [40, 44] {
            let (a, b) = Matrix::from_ggml(ty, &bytes, rows, cols).unwrap().split_rows(at).unwrap();
            assert_eq!((a.rows(), b.rows()), (at, rows - at));
            let (ya, yb) = (a.apply(&x), b.apply(&x));
            for (i, (got, want)) in ya.iter().chain(&yb).zip(&whole).enumerate() {
                // The halves may sum a row with another kernel than the whole matrix did.
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{ty} split at {at}, row {i}: {got} vs {want}");
            }
            let (mut wa, mut wb) = (vec![0.0; at * cols], vec![0.0; (rows - at) * cols]);
            for (r, w) in wa.chunks_mut(cols).enumerate() {
                w.copy_from_slice(&a.row(r));
            }
            for (r, w) in wb.chunks_mut(cols).enumerate() {
                w.copy_from_slice(&b.row(r));
            }
            let whole_matrix = Matrix::from_ggml(ty, &bytes, rows, cols).unwrap();
            let rows_of_whole: Vec<f32> = (0..rows).flat_map(|r| whole_matrix.row(r)).collect();
            assert_eq!([wa, wb].concat(), rows_of_whole, "{ty} split at {at}: the rows' values");
        }
        assert!(Matrix::from_ggml(ty, &bytes, rows, cols).unwrap().split_rows(97).is_err());
    }
}

#[test]
fn unsupported_types_and_ragged_rows_are_errors() {
    let q2 = quant::quantize(GgmlType::Q2_K, &[0.5; 256]).unwrap();
    assert!(Matrix::from_ggml(GgmlType::Q2_K, &q2, 1, 256).is_err());
    assert_eq!(Matrix::stored_bytes(GgmlType::Q2_K, 1, 256, false), None);
    let q4 = quant::quantize(GgmlType::Q4_0, &[0.5; 64]).unwrap();
    assert!(Matrix::from_ggml(GgmlType::Q4_0, &q4, 1, 32).is_err(), "byte count of 2 rows for 1");
    let k = quant::quantize(GgmlType::Q4_K, &[0.5; 512]).unwrap();
    assert!(Matrix::from_ggml(GgmlType::Q4_K, &k, 4, 128).is_err(), "rows of half a super-block");
}

/// A matrix is converted a run of blocks at a time (4096): over several runs, the last one
/// partial, every row still gathers the dequantizer's values and its products agree with the
/// same rows converted alone; its bytes are one of the two layouts `stored_bytes` gives. Rows one
/// after another (2100) and in whole interleaved groups (2104; Q6_K's levels then in 6 bits).
#[test]
fn matrices_of_many_decoding_runs_keep_every_row() {
    let mut rng = StdRng::seed_from_u64(9);
    // About 1,075,000 weights: 4.1 runs of 256-weight blocks, 32.8 of 32-weight ones. The tail
    // converted alone is as many rows as keep the whole matrix's layout.
    let cols = 512;
    for (rows, tail_rows) in [(2100, 52), (2104, 56)] {
        for ty in TYPES {
            let bytes = quant::quantize(ty, &random(&mut rng, rows * cols, 0.05)).unwrap();
            let mut w = vec![0.0; rows * cols];
            quant::dequantize(ty, &bytes, &mut w).unwrap();
            let m = Matrix::from_ggml(ty, &bytes, rows, cols).unwrap();
            // What the will-it-fit estimate counts: the layout in f32 scales (wasm) or natively.
            let stored = [false, true].map(|native| Matrix::stored_bytes(ty, rows as u64, cols as u64, native).unwrap());
            assert!(stored.contains(&(m.bytes() as u64)), "{ty}: {} bytes, the layouts {stored:?}", m.bytes());
            for r in [0, 255, 256, 1024, 2047, 2048, rows - 1] {
                assert_eq!(m.row(r), w[r * cols..][..cols].to_vec(), "{ty} {rows} rows: row {r}");
            }
            let tail_bytes = &bytes[bytes.len() - tail_rows * ty.row_bytes(cols as u64).unwrap() as usize..];
            let alone = Matrix::from_ggml(ty, tail_bytes, tail_rows, cols).unwrap();
            let x = random(&mut rng, cols, 1.0);
            assert_eq!(m.apply(&x)[rows - tail_rows..], alone.apply(&x)[..], "{ty} {rows} rows");
        }
    }
}
