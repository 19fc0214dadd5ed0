//! Arithmetic-bound work (`shaders/fma.wgsl`): the device's multiply-add rate, the yardstick of
//! `kestrel bench kernels`' "fraction of FMA peak" for the matrix products.

use std::sync::Arc;

use super::Bindings;
use crate::{DType, Defines, Dispatch, Gpu, GpuError, Tensor};

/// Independent vec4 chains per thread (`CHAINS` in the shader).
const CHAINS: u64 = 8;

kestrel_ops::gpu_struct! {
    /// The FMA kernel's uniform (`Params` in `shaders/fma.wgsl`).
    pub struct FmaParams as Params {
        pub iterations: u32,
        /// Each step maps a to a * scale + shift: |a| stays bounded (scale < 1), never denormal.
        pub scale: f32,
        pub shift: f32,
    }
}

impl FmaParams {
    /// Floating-point operations of one thread (a multiply-add counts two).
    pub fn flops_per_thread(&self) -> u64 {
        u64::from(self.iterations) * CHAINS * 4 * 2
    }

    /// What thread `i` writes, computed as the shader does (f32 fused multiply-adds in order).
    pub fn expected(&self, i: u32) -> f32 {
        (0..CHAINS as u32)
            .map(|j| {
                let start = [(i % 1024) as f32, j as f32, 1.0, -1.0].map(|v| v * 1e-3);
                start.map(|mut a| {
                    for _ in 0..self.iterations {
                        a = a.mul_add(self.scale, self.shift);
                    }
                    a
                })
            })
            .fold([0f32; 4], |sum, a| [sum[0] + a[0], sum[1] + a[1], sum[2] + a[2], sum[3] + a[3]])
            .iter()
            .sum()
    }
}

pub struct FmaKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl FmaKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("fma", "main", &Defines::new()).await? })
    }

    /// Binds one thread per element of `out` (f32).
    pub fn bind(&self, gpu: &Gpu, out: &Tensor, params: FmaParams) -> Result<Dispatch, GpuError> {
        if out.dtype != DType::F32 || out.is_empty() {
            return Err(GpuError::InvalidArgs("fma: out must be a non-empty f32 tensor".into()));
        }
        let threads = out.len() as u32;
        Ok(Bindings::new(gpu, "fma").uniform(&params).tensor(out).dispatch_grid(&self.pipeline, threads.div_ceil(256)))
    }
}
