use std::sync::Arc;

use super::Bindings;
use crate::{Defines, Dispatch, Gpu, GpuError, Tensor};

kestrel_ops::gpu_struct! {
    /// The copy kernel's uniform (`Params` in shaders/copy.wgsl).
    pub(crate) struct CopyParams as Params {
        /// 16-byte elements to copy.
        n_vec4: u32,
    }
}

/// `dst = src`, 16 bytes per thread: the bandwidth yardstick of `kestrel bench kernels`.
pub struct CopyKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl CopyKernel {
    pub async fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Ok(Self { pipeline: gpu.pipelines.get("copy", "main", &Defines::new()).await? })
    }

    /// Binds a copy of all of `src` into `dst`; both sizes must be equal multiples of 16 bytes.
    pub fn bind(&self, gpu: &Gpu, src: &Tensor, dst: &Tensor) -> Result<Dispatch, GpuError> {
        if src.byte_size() != dst.byte_size() || !src.byte_size().is_multiple_of(16) {
            return Err(GpuError::InvalidArgs(format!(
                "copy: sizes {} and {} must be equal multiples of 16 bytes",
                src.byte_size(),
                dst.byte_size()
            )));
        }
        let n_vec4 = (src.byte_size() / 16) as u32;
        let bindings = Bindings::new(gpu, "copy").uniform(&CopyParams { n_vec4 }).tensor(src).tensor(dst);
        Ok(bindings.dispatch_grid(&self.pipeline, n_vec4.div_ceil(256)))
    }
}
