//! Kestrel's GPU runtime: device and limits, tensors, a pipeline cache built from the WGSL files
//! in `shaders/`, a recorder that batches dispatches into one submit, the per-step uniform and
//! the `StepOp`s that record from it, async readback, the weights' GPU layout (`layout`) and the
//! kernels (`kernels`). The parameter types the kernels take and their f32 CPU references are
//! kestrel-ops', shared with the CPU backend. It knows nothing about language models beyond the
//! shapes of its kernels.

mod device;
mod error;
mod faults;
mod pipeline;
mod preprocess;
mod readback;
mod recorder;
mod shaders;
mod shards;
mod signal;
mod step;
mod tensor;

pub mod kernels;
pub mod layout;

pub use device::{Gpu, GpuFeatures, GpuInfo, GpuOptions, KernelChoice, MatvecVariant, UploadFlusher, WRITE_PIECE};
pub use error::GpuError;
pub use pipeline::{PipelineCache, PipelineKey};
pub use preprocess::{preprocess, Defines};
pub use readback::Readback;
pub use recorder::{grid, Dispatch, Recorder};
pub use shaders::shader_source;
pub use shards::{RowShard, RowShards};
pub use step::{StepOp, StepParams, StepRows, StepUniform};
pub use tensor::{DType, Tensor, WeightTensor};

pub use wgpu;
