//! The operations both backends implement, with neither backend in its tree: the parameter
//! types each kernel takes (`params`), their plain f32 CPU references (`reference`), the one f32
//! dot product both the references and the CPU backend sum with (`dot`), and `gpu_struct!`, the
//! single definition of a parameter block the GPU reads as a uniform or storage struct.
//! kestrel-gpu's kernels and tests, kestrel-cpu and the model's CPU graph all import from here,
//! so the GPU and CPU backends never import each other.

mod dot;
mod gpu_struct;

pub mod params;
pub mod reference;

pub use dot::{f32_dot_portable, F32_LANES};
pub use gpu_struct::GpuScalar;
