//! The portable dot product of a weight row and an activation row, one weight at a time: the
//! kernels of a machine without the SIMD code, and the reference the SIMD kernels are tested
//! against.

use crate::rows::{ActRow, IntRow, Levels};
use crate::ACT_BLOCK;

/// `Σ_g offset[g] · Σ_{e in g} x[e]` over groups of `group` weights, one group after another as
/// llama.cpp adds them (a few dozen terms a row: a plain loop).
#[inline]
fn offsets_dot(offset: &[f32], group: usize, x: ActRow<'_>) -> f32 {
    offset.iter().zip(x.group_sums(group)).map(|(o, s)| o * s).sum()
}

/// Level `e` (0..32) of block `b`.
fn level(levels: Levels<'_>, b: usize, e: usize) -> i32 {
    match levels {
        Levels::Nibbles(n) => {
            let byte = n[b * ACT_BLOCK / 2 + e % 16];
            i32::from(if e < 16 { byte & 0x0F } else { byte >> 4 })
        }
        Levels::Bytes(q) => i32::from(q[b * ACT_BLOCK + e]),
    }
}

pub(super) fn int_dot_portable(w: IntRow<'_>, x: ActRow<'_>) -> f32 {
    let mut sum = 0f32;
    for (b, (xq, &d)) in x.q.chunks_exact(ACT_BLOCK).zip(x.d).enumerate() {
        let part = |range: std::ops::Range<usize>| range.map(|e| level(w.levels, b, e) * i32::from(xq[e])).sum::<i32>() as f32;
        sum += if w.group == ACT_BLOCK {
            w.scale[b] * d * part(0..32)
        } else {
            d * (w.scale[2 * b] * part(0..16) + w.scale[2 * b + 1] * part(16..32))
        };
    }
    sum + w.offset.map_or(0.0, |o| offsets_dot(o, w.group, x))
}
