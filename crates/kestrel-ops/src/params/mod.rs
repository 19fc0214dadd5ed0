//! Parameter types shared by the kernels and their CPU references: each kernel takes them at
//! bind or write time and its reference computes from the same values, so neither imports the
//! other.

mod activation;
mod attention;
mod rope;
mod sampling;

pub use activation::GateActivation;
pub use attention::{AttentionShape, KvType, Scores};
pub use rope::{RopeConfig, RopeMode, YarnRamp};
pub use sampling::{Penalties, PenaltyEntry, SamplingParams};
