//! The searches shared by ggml's reference K-quant quantizers (ggml-quants.c, "2-6 bit
//! quantization in super-blocks"), ported operation for operation: the same f32 expressions in
//! the same order, so that the chosen levels and scales are bit-identical. ggml compiled with
//! floating-point contraction (FMA) may round differently; the plain C semantics are the
//! reference here, as they are for the `gguf` Python package.

use super::{f16_bits, f16_value, signed_abs_max, QK_K};

/// ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this is all zeros.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, through the f32 bit pattern of
/// x + 1.5 * 2^23. Only meaningful for |x| < 2^22, like ggml's; larger or non-finite inputs give
/// a wrong but harmless level that the callers clamp, exactly as ggml does (no panic).
pub(super) fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() as i32 & 0x007F_FFFF) - 0x0040_0000
}

/// `make_qx_quants` as the reference quantizers call it (rmse_type 1, no importance
/// weights): symmetric levels -nmax..nmax-1 stored as level + nmax, weights x^2, and the
/// least-squares scale of the best of 19 trial scales around -nmax / max.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let (amax, max) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut store = |iscale: f32| {
        for (out, &v) in levels.iter_mut().zip(x) {
            *out = (nmax + level(iscale, v)) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    store(iscale);
    let (sumlx, suml2) = fit(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with do_rmse: levels -nmax..nmax-1 (stored + nmax) from -nmax / max,
/// then up to five passes moving single levels while the weighted fit improves.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let (amax, max) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut ls: Vec<i32> = x.iter().map(|&v| nearest_int(iscale * v).clamp(-nmax, nmax - 1)).collect();
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (&v, &l) in x.iter().zip(&ls) {
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (&v, l) in x.iter().zip(ls.iter_mut()) {
            let w = v * v;
            let mut slx = sumlx - w * v * *l as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *l as f32 * *l as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (out, l) in levels.iter_mut().zip(ls) {
        *out = (l + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The trial-scale search of `make_qkx2_quants` (rmin, rdelta, nstep in ggml's terms).
pub(super) struct Search {
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Absolute instead of squared errors.
    pub use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric levels 0..=nmax with w = scale * l - min; returns
/// (scale, min) and writes the levels. Tries `nstep + 1` scales and keeps the best weighted
/// least-squares (scale, min) pair.
pub(super) fn make_qkx2_quants(nmax: i32, x: &[f32], weights: &[f32], levels: &mut [u8], search: &Search) -> (f32, f32) {
    let (Some(&x0), Some(&w0)) = (x.first(), weights.first()) else {
        return (0.0, 0.0);
    };
    let (mut min, mut max) = (x0, x0);
    let mut sum_w = w0;
    let mut sum_x = sum_w * x0;
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |scale: f32, min: f32, ls: &[u8]| {
        let mut total = 0.0f32;
        for ((&v, &w), &l) in x.iter().zip(weights).zip(ls) {
            let diff = scale * f32::from(l) + min - v;
            total += w * if search.use_mad { diff.abs() } else { diff * diff };
        }
        total
    };
    let quantize_all = |iscale: f32, min: f32, ls: &mut [u8]| {
        for (l, &v) in ls.iter_mut().zip(x) {
            *l = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
        }
    };
    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    quantize_all(iscale, min, levels);
    let mut best_error = error(scale, min, levels);
    let mut aux = vec![0u8; x.len()];
    for is in 0..=search.nstep {
        let iscale = (search.rmin + search.rdelta * is as f32 + nmax as f32) / (max - min);
        quantize_all(iscale, min, &mut aux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((&v, &w), &l) in x.iter().zip(weights).zip(&aux) {
            let l = f32::from(l);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(this_scale, this_min, &aux);
            if cur_error < best_error {
                levels.copy_from_slice(&aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Bytes of the packed 6-bit scales and mins of Q4_K and Q5_K.
pub(super) const SCALE_MIN_BYTES: usize = 12;

/// `get_scale_min_k4`: the 6-bit (scale, min) of sub-block `j` (0..8). Bytes 0-3 hold scales
/// 0-3, bytes 4-7 mins 0-3 (low 6 bits each); sub-blocks 4-7 keep their low 4 bits in bytes
/// 8-11 (scale low nibble, min high nibble) and their top 2 bits in the spare top bits of
/// bytes 0-7.
pub(super) fn scale_min_k4(j: usize, q: &[u8; SCALE_MIN_BYTES]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The reference Q4_K/Q5_K analysis of one super-block: eight 32-element sub-blocks, each
/// fitted with `make_qkx2_quants`, their scales and mins quantized to 6 bits against the
/// super-block's f16 `d` and `dmin`, then every element re-quantized with the rounded scales.
pub(super) struct ScaleMinBlock {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; SCALE_MIN_BYTES],
    /// One level 0..=nmax per element.
    pub levels: [u8; QK_K],
}

pub(super) fn quantize_scale_min(x: &[f32; QK_K], nmax: i32, search: &Search) -> ScaleMinBlock {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for (((xs, ls), scale), min) in x.chunks_exact(32).zip(levels.chunks_exact_mut(32)).zip(&mut scales).zip(&mut mins) {
        let sum_x2 = xs.iter().fold(0.0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (*scale, *min) = make_qkx2_quants(nmax, xs, &weights, ls, search);
        if *scale > max_scale {
            max_scale = *scale;
        }
        if *min > max_min {
            max_min = *min;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; SCALE_MIN_BYTES];
    for (j, (&scale, &min)) in scales.iter().zip(&mins).enumerate() {
        // ggml stores nearest_int's int into a uint8_t (mod 256) before clamping to 63.
        let ls = (nearest_int(inv_scale * scale) as u8).min(63);
        let lm = (nearest_int(inv_min * min) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16_bits(max_scale / 63.0);
    let dmin = f16_bits(max_min / 63.0);
    for (j, (xs, ls)) in x.chunks_exact(32).zip(levels.chunks_exact_mut(32)).enumerate() {
        let (sc, m) = scale_min_k4(j, &packed);
        let d = f16_value(d) * f32::from(sc);
        if d == 0.0 {
            // ggml keeps the levels of the first fit for a sub-block whose scale rounds to 0.
            continue;
        }
        let dm = f16_value(dmin) * f32::from(m);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, nmax) as u8;
        }
    }
    ScaleMinBlock { d, dmin, scales: packed, levels }
}

/// Packs 2-bit levels (0..=3) as Q2_K and Q3_K store them: each 128-element half fills 32
/// bytes, element 32 * k + l of the half in bits 2k..2k+2 of byte l.
pub(super) fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for (half, out) in levels.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for (l, q) in out.iter_mut().enumerate() {
            *q = half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6);
        }
    }
}

/// The 2-bit level of element `e` (0..256) in Q2_K/Q3_K `qs` (the inverse of `pack_2bit`).
pub(super) fn level_2bit(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}
