//! Tensors on the GPU: activations (f32 or u32 elements) and weights repacked from GGUF blocks
//! into the aligned layout the kernels read (see `layout::pack_for_gpu`).

use kestrel_gguf::{quant, GgmlType};

use crate::{layout, Gpu, GpuError, Readback};

/// Element type of an activation tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    U32,
}

/// A dense activation tensor, row-major, last dimension contiguous.
pub struct Tensor {
    pub buffer: wgpu::Buffer,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Tensor {
    pub fn zeros(gpu: &Gpu, label: &str, shape: &[usize], dtype: DType) -> Result<Self, GpuError> {
        let buffer = gpu.storage_buffer(label, 4 * shape.iter().product::<usize>() as u64)?;
        Ok(Self { buffer, shape: shape.to_vec(), dtype })
    }

    pub fn from_f32(gpu: &Gpu, label: &str, shape: &[usize], data: &[f32]) -> Result<Self, GpuError> {
        check_len(label, shape, data.len())?;
        let buffer = gpu.storage_buffer_init(label, bytemuck::cast_slice(data))?;
        Ok(Self { buffer, shape: shape.to_vec(), dtype: DType::F32 })
    }

    pub fn from_u32(gpu: &Gpu, label: &str, shape: &[usize], data: &[u32]) -> Result<Self, GpuError> {
        check_len(label, shape, data.len())?;
        let buffer = gpu.storage_buffer_init(label, bytemuck::cast_slice(data))?;
        Ok(Self { buffer, shape: shape.to_vec(), dtype: DType::U32 })
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn byte_size(&self) -> u64 {
        4 * self.len() as u64
    }

    /// Copies the tensor back (submitting its own copy: for tests and tools, not for the decode
    /// path, which reads back only a token id).
    pub async fn read_bytes(&self, gpu: &Gpu) -> Result<Vec<u8>, GpuError> {
        let readback = Readback::new(gpu, self.byte_size());
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.buffer, 0, readback.buffer(), 0, self.byte_size());
        gpu.queue.submit([encoder.finish()]);
        readback.read(gpu, self.byte_size()).await
    }

    pub async fn read_f32(&self, gpu: &Gpu) -> Result<Vec<f32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(gpu).await?))
    }

    pub async fn read_u32(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(gpu).await?))
    }
}

fn check_len(label: &str, shape: &[usize], len: usize) -> Result<(), GpuError> {
    let expected: usize = shape.iter().product();
    if expected != len {
        return Err(GpuError::InvalidArgs(format!("{label}: shape {shape:?} needs {expected} values, got {len}")));
    }
    Ok(())
}

/// A weight matrix of `rows` x `cols` (cols contiguous, as GGUF stores it: ggml dims [cols, rows])
/// in the GPU layout of its type: the packed quants, then the high-bit plane from `plane_offset`
/// words (5- and 6-bit types), then the scales from `scale_offset` words.
pub struct WeightTensor {
    pub buffer: wgpu::Buffer,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub plane_offset: u32,
    pub scale_offset: u32,
}

impl WeightTensor {
    /// Repacks GGUF block bytes and uploads them.
    pub fn from_gguf_bytes(gpu: &Gpu, label: &str, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, GpuError> {
        if !layout::is_gpu_supported(ty) {
            return Err(GpuError::UnsupportedWeights(format!("{label}: {}", ty.name())));
        }
        let packed = layout::pack_for_gpu(ty, bytes, rows as u64, cols as u64)?;
        let buffer = gpu.storage_buffer_init(label, bytemuck::cast_slice(&packed.words))?;
        Ok(Self { buffer, ty, rows, cols, plane_offset: packed.plane_offset, scale_offset: packed.scale_offset })
    }

    /// Quantizes f32 values (row-major rows x cols) to `ty` and uploads them: for tests/benches.
    pub fn from_f32(gpu: &Gpu, label: &str, ty: GgmlType, rows: usize, cols: usize, values: &[f32]) -> Result<Self, GpuError> {
        let bytes = quant::quantize(ty, values)?;
        Self::from_gguf_bytes(gpu, label, ty, rows, cols, &bytes)
    }

    pub fn byte_size(&self) -> u64 {
        self.buffer.size()
    }
}
