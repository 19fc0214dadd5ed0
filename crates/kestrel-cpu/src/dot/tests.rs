use super::*;
use crate::activations::{ActFormat, QuantizedRows};
use crate::rows::{f16_to_f32, Levels, Scales};

/// Every kernel set's tiles give each product the bits of its own dot product, for any count
/// of rows and tokens (odd ones, and past a token block) and row lengths with and without a
/// tail.
#[test]
fn f32_products_are_each_dot_products_bits() {
    for set in available() {
        for (rows, n, cols) in [(5, 7, 40), (4, 33, 384), (1, 1, 16), (3, 70, 100)] {
            let value = |i: usize| ((i as u64 * 2_654_435_761) % 1000) as f32 / 333.0 - 1.5;
            let w: Vec<f32> = (0..rows * cols).map(value).collect();
            let x: Vec<f32> = (0..n * cols).map(|i| value(i + 17)).collect();
            let mut tiled = vec![0.0; rows * n];
            (set.f32_products)(&w, &x, cols, &mut tiled);
            // One weight row and one token a call: no tile, each product on its own.
            let one_by_one: Vec<f32> = (0..rows * n)
                .map(|i| {
                    let mut y = [0.0];
                    (set.f32_products)(&w[i / n * cols..][..cols], &x[i % n * cols..][..cols], cols, &mut y);
                    y[0]
                })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&tiled), bits(&one_by_one), "{}: {rows} x {n} x {cols}", set.name);
        }
    }
}

#[test]
fn f16_conversion_is_halfs_for_every_value() {
    for bits in 0..=u16::MAX {
        let (got, want) = (f16_to_f32(bits), half::f16::from_bits(bits).to_f32());
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{bits:#06x}: {got} vs {want}");
    }
}

/// Every kernel set the machine runs gives the portable code's sums (up to the order of the
/// f32 additions), for every layout a matrix keeps, with and without offsets, over several
/// rows and tokens: whole tiles of rows and tokens and the remainders of each.
#[test]
fn chosen_kernels_agree_with_the_portable_ones() {
    // 576 weights a row: whole steps of 8 offset groups and a masked last step (18 or 36
    // groups); 160: rows of 5 groups (scalar offsets) and of 10 (one step and a masked one).
    for cols in [576, 160] {
        kernels_agree_with_the_portable_ones(cols);
    }
    let x: Vec<f32> = (0..9 * 576).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
    let want = f32_dot_portable(&x, &x);
    for set in available() {
        let mut got = [0.0];
        (set.f32_products)(&x, &x, x.len(), &mut got);
        let got = got[0];
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{}", set.name);
    }
}

fn kernels_agree_with_the_portable_ones(cols: usize) {
    let rows = 5;
    let bytes: Vec<i8> = (0..rows * cols).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
    let nibbles: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 53 % 256) as u8).collect();
    let x: Vec<f32> = (0..9 * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0 * (1 + i % 7) as f32).collect();
    for (levels, group) in [(Levels::Bytes(&bytes), 16), (Levels::Bytes(&bytes), 32), (Levels::Nibbles(&nibbles), 32)] {
        // Exact in f16, so the f16 storage must give the f32 one's sums.
        let scale: Vec<f32> = (0..rows * cols / group).map(|g| (1 + g % 11) as f32 / 256.0).collect();
        let offset: Vec<f32> = (0..rows * cols / group).map(|g| -((g % 13) as f32) / 64.0).collect();
        let to_f16 = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<u16>>();
        let (scale16, offset16) = (to_f16(&scale), to_f16(&offset));
        let stores = [(Scales::F32(&scale), Scales::F32(&offset)), (Scales::F16(&scale16), Scales::F16(&offset16))];
        for (format, n) in [ActFormat::Q8_0, ActFormat::Q8K].into_iter().flat_map(|f| [1, 3, 9].map(|n| (f, n))) {
            let xq = QuantizedRows::new(&x[..n * cols], format);
            for (offset, (scale, stored_offset)) in [None, Some(())].into_iter().flat_map(|o| stores.map(|s| (o, s))) {
                let offset = offset.map(|()| stored_offset);
                let w = IntRows { levels, group, scale, offset, cols };
                let mut want = vec![0f32; rows * n];
                products_by(w, &xq, &mut want, int_dot_portable);
                for set in available() {
                    let mut got = vec![0f32; rows * n];
                    (set.int)(w, &xq, &mut got);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                            "{} cols {cols} group {group} {format:?} n {n} [{i}]: {g} vs {w}",
                            set.name
                        );
                    }
                }
            }
        }
    }
}
