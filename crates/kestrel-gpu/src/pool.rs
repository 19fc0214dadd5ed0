//! Reuse of scratch buffers between calls. Model weights and the KV cache are allocated once
//! at load and never pooled; the pool serves temporaries (prefill scratch, tests, benchmarks)
//! so that repeated work does not allocate GPU memory each time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{Gpu, GpuError};

#[derive(Clone, Default)]
pub struct BufferPool {
    free: Arc<Mutex<HashMap<u64, Vec<wgpu::Buffer>>>>,
}

impl BufferPool {
    pub fn new() -> Self {
        Self::default()
    }

    /// A storage buffer of at least `size` bytes. Sizes are bucketed to powers of two so that
    /// slightly different requests share buffers.
    pub fn acquire(&self, gpu: &Gpu, size: u64) -> Result<wgpu::Buffer, GpuError> {
        let bucket = bucket(size);
        if let Some(buffer) = self.lock().get_mut(&bucket).and_then(Vec::pop) {
            return Ok(buffer);
        }
        gpu.storage_buffer("pooled", bucket)
    }

    /// Returns a buffer for reuse. Its contents are not cleared.
    pub fn release(&self, buffer: wgpu::Buffer) {
        self.lock().entry(buffer.size()).or_default().push(buffer);
    }

    /// Bytes held by buffers waiting for reuse.
    pub fn idle_bytes(&self) -> u64 {
        self.lock().iter().map(|(size, v)| size * v.len() as u64).sum()
    }

    /// Drops every idle buffer, giving its memory back to the device.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<wgpu::Buffer>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn bucket(size: u64) -> u64 {
    size.max(256).next_power_of_two()
}

#[cfg(test)]
mod tests {
    #[test]
    fn buckets_are_powers_of_two_at_least_256() {
        assert_eq!(super::bucket(1), 256);
        assert_eq!(super::bucket(256), 256);
        assert_eq!(super::bucket(257), 512);
        assert_eq!(super::bucket(1 << 20), 1 << 20);
    }
}
