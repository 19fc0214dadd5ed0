//! Where a decode step's time goes: the GPU time of each kernel family (timed one family at a
//! time with the kernel benchmarks' timer: GPU timestamps where the adapter has them, else the
//! host clock around a submit), the host time to encode and submit a step, and the roofline
//! (weight bytes per token over the copy kernel's bandwidth).

use std::time::Duration;

use kestrel_model::Model;
use serde::Serialize;

use super::stats::median;
use super::timing::{Timer, TimingSettings};
use super::BenchResult;

/// Host-timed decode steps whose median is reported.
const HOST_STEPS: usize = 3;

/// GPU time of one kernel family in one decode step.
#[derive(Debug, Serialize)]
pub struct FamilyTime {
    pub family: &'static str,
    pub gpu_ms: f64,
    /// Of the sum over the families.
    pub share: f64,
}

#[derive(Debug, Serialize)]
pub struct StepProfile {
    /// The position decoded at (its KV length is `pos + 1`).
    pub pos: usize,
    pub timing: &'static str,
    pub families: Vec<FamilyTime>,
    pub families_sum_gpu_ms: f64,
    /// Writing the step uniform, recording every dispatch and submitting (median).
    pub host_encode_submit_ms: f64,
    /// The same step from encoding to the sampled token on the host (median).
    pub host_step_ms: f64,
}

/// How often a family is timed: a short budget, since each family is a fraction of a step and a
/// slow device (lavapipe) spends about a second per step.
pub fn family_settings() -> TimingSettings {
    TimingSettings { target: Duration::from_millis(300), reps: 3, calls: None }
}

/// Profiles a decode step at `pos`. Leaves the model's cache cleared (it overwrites the KV
/// cache at `pos`).
pub fn profile(model: &mut Model, timer: &Timer, pos: usize, token: u32) -> BenchResult<StepProfile> {
    let mut host = Vec::with_capacity(HOST_STEPS);
    for _ in 0..HOST_STEPS {
        host.push(pollster::block_on(model.time_decode_step(token, pos))?);
    }
    let host_encode_submit_ms = median(&mut host.iter().map(|h| h.encode_submit_ms).collect::<Vec<_>>());
    let host_step_ms = median(&mut host.iter().map(|h| h.total_ms).collect::<Vec<_>>());

    let mut timed = Vec::new();
    for family in model.decode_families(pos)? {
        let ms = timer.measure(&*family.record)?.seconds_per_call * 1e3;
        eprintln!("  {:<22} {ms:>9.3} ms", family.name);
        timed.push((family.name, ms));
    }
    let families_sum_gpu_ms: f64 = timed.iter().map(|(_, ms)| ms).sum();
    let families =
        timed.into_iter().map(|(family, gpu_ms)| FamilyTime { family, gpu_ms, share: gpu_ms / families_sum_gpu_ms.max(1e-12) }).collect();
    Ok(StepProfile { pos, timing: timer.method(), families, families_sum_gpu_ms, host_encode_submit_ms, host_step_ms })
}

/// "decode runs at X% of this device's memory-bandwidth limit".
#[derive(Debug, Serialize)]
pub struct Roofline {
    pub weight_bytes_per_token: u64,
    pub copy_gb_per_s: f64,
    /// The time per token if reading the weights once were all a step did, at copy speed.
    pub limit_ms_per_token: f64,
    /// Median time per decoded token of the first workload.
    pub achieved_ms_per_token: f64,
    /// limit / achieved.
    pub fraction_of_limit: f64,
}

impl Roofline {
    pub fn new(weight_bytes_per_token: u64, copy_gb_per_s: f64, decode_tok_s: f64) -> Self {
        let limit_ms_per_token = weight_bytes_per_token as f64 / (copy_gb_per_s * 1e9) * 1e3;
        let achieved_ms_per_token = 1e3 / decode_tok_s.max(1e-12);
        Self {
            weight_bytes_per_token,
            copy_gb_per_s,
            limit_ms_per_token,
            achieved_ms_per_token,
            fraction_of_limit: limit_ms_per_token / achieved_ms_per_token,
        }
    }
}
