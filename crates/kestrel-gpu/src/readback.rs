//! Reading results back to the CPU. On wasm the map is awaited as a promise and never blocks
//! the worker; natively the device is polled until the map completes.

use crate::signal::Signal;
use crate::{Gpu, GpuError};

/// A mappable staging buffer that results are copied into before being read.
pub struct Readback {
    buffer: wgpu::Buffer,
}

impl Readback {
    pub fn new(gpu: &Gpu, size: u64) -> Self {
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Self { buffer }
    }

    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    pub fn size(&self) -> u64 {
        self.buffer.size()
    }

    /// Maps the first `size` bytes (after the submit that copied into it) and returns them.
    pub async fn read(&self, gpu: &Gpu, size: u64) -> Result<Vec<u8>, GpuError> {
        self.read_after(gpu, size, None).await
    }

    /// `read`, waiting natively only for `submission` (the one that copied into this buffer) and
    /// not for later ones: steps submitted ahead keep the device busy while this is read.
    pub async fn read_after(&self, gpu: &Gpu, size: u64, submission: Option<wgpu::SubmissionIndex>) -> Result<Vec<u8>, GpuError> {
        if size > self.buffer.size() || !size.is_multiple_of(4) {
            return Err(GpuError::Readback(format!(
                "asked for {size} bytes of a {}-byte readback buffer (must be a multiple of 4)",
                self.buffer.size()
            )));
        }
        let slice = self.buffer.slice(..size);
        let signal = Signal::<Result<(), wgpu::BufferAsyncError>>::default();
        let sender = signal.clone();
        slice.map_async(wgpu::MapMode::Read, move |result| sender.complete(result));
        #[cfg(not(target_arch = "wasm32"))]
        gpu.device
            .poll(wgpu::PollType::Wait { submission_index: submission, timeout: None })
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = (gpu, submission);
        if let Err(e) = signal.await {
            // A map fails when the device is lost; natively wgpu reports the loss only once the
            // queue has drained, so drain it: the caller's fault check then names the loss.
            #[cfg(not(target_arch = "wasm32"))]
            let _ = gpu.device.poll(wgpu::PollType::wait_indefinitely());
            return Err(GpuError::Readback(e.to_string()));
        }
        let bytes = slice.get_mapped_range().map_err(|e| GpuError::Readback(e.to_string()))?.to_vec();
        self.buffer.unmap();
        Ok(bytes)
    }

    /// Reads `size` bytes as little-endian f32 values.
    pub async fn read_f32(&self, gpu: &Gpu, size: u64) -> Result<Vec<f32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(gpu, size).await?))
    }

    /// Reads `size` bytes as u32 values.
    pub async fn read_u32(&self, gpu: &Gpu, size: u64) -> Result<Vec<u32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read(gpu, size).await?))
    }
}
