//! The f32 dot product the references sum with. It lives here, not in kestrel-cpu, because both
//! backends' sides use it: the f32 references (the GPU's tests, the model's reference forward
//! pass) and the CPU backend, whose SIMD versions keep its lanes.

/// Lanes of partial sums: independent chains the compiler can keep in SIMD registers.
pub const F32_LANES: usize = 8;

/// `Σ a[i]·b[i]` in `F32_LANES` interleaved partial sums, added at the end: as exact as one
/// running sum (closer, for long rows) and free of its chain of dependent additions, so the
/// compiler keeps the lanes in SIMD registers. The same on every machine (no run-time choice):
/// the f32 reference's products use it too.
pub fn f32_dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; F32_LANES];
    let (a_body, b_body) = (a.chunks_exact(F32_LANES), b.chunks_exact(F32_LANES));
    let tail: f32 = a_body.remainder().iter().zip(b_body.remainder()).map(|(x, y)| x * y).sum();
    for (a8, b8) in a_body.zip(b_body) {
        for ((lane, x), y) in lanes.iter_mut().zip(a8).zip(b8) {
            *lane += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}
