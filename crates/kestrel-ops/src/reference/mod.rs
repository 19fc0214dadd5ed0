//! Plain, readable f32 CPU implementations of every kernel. Tests compare the GPU against these;
//! the model's CPU reference forward pass is built from them.

pub mod attention;
pub mod embedding;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod sample;
