//! Shared by the kernel tests: device creation that fails loudly when there is no adapter (CI
//! must never skip GPU tests silently), seeded random data, and tolerance checks.
#![allow(dead_code)]

use kestrel_gpu::{Gpu, GpuOptions, MatvecVariant};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// The test device. Panics with instructions when no adapter is found.
pub fn gpu() -> Gpu {
    gpu_with(&GpuOptions::default())
}

/// A device with subgroups (and f16) forced off, to test the workgroup-memory fallbacks, and
/// the matvec variant of the other kind of adapter (a GPU's on a software adapter and the
/// reverse), so that both variants are tested on every machine.
pub fn gpu_without_subgroups() -> Gpu {
    let software = gpu().info.software;
    gpu_with(&GpuOptions {
        allow_f16: false,
        allow_subgroups: false,
        allow_timestamps: false,
        max_storage_binding: None,
        matvec: Some(MatvecVariant::for_adapter(!software)),
    })
}

pub fn gpu_with(options: &GpuOptions) -> Gpu {
    match Gpu::new_blocking(options) {
        Ok(gpu) => gpu,
        Err(e) => panic!(
            "no GPU adapter for the kernel tests ({e}); on a machine without a GPU install Mesa's \
             lavapipe: apt-get install mesa-vulkan-drivers"
        ),
    }
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in [-scale, scale).
pub fn random_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise, reporting the worst offender.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g}");
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(worst.1 <= 0.0, "{what}: element {i}: got {}, want {} (rtol {rtol}, atol {atol})", got[i], want[i]);
}
