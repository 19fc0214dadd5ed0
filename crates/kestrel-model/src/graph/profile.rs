//! Benchmark hooks into a decode step (`kestrel bench model`): the step's plan grouped by kernel
//! family, to be timed one family at a time, and the host time to encode and submit a step.
//! Kept apart from `submit_step` so the hot path carries no instrumentation.

use kestrel_gpu::{GpuError, Recorder, StepParams};
use web_time::Instant;

use super::plan::{self, PlannedOp};
use super::{Graph, StepAt, StepInput, StepOutput};

/// One kernel family of a decode step: `record` records that family's parts of the step's
/// plan, every layer's, exactly as the step records them.
pub struct KernelFamily<'a> {
    pub name: &'static str,
    pub record: Box<dyn Fn(&mut Recorder) + 'a>,
}

/// Host-side time of one decode step.
#[derive(Clone, Copy, Debug)]
pub struct StepHostTime {
    /// Writing the step's uniforms, recording every dispatch and submitting.
    pub encode_submit_ms: f64,
    /// From the start of encoding until the sampled token is back on the host.
    pub total_ms: f64,
}

impl Graph {
    /// Writes the step uniform of a one-token step at `pos` and returns that step's plan grouped
    /// by family, in the order each family first runs (copies excluded: they end a compute
    /// pass, which per-pass timestamps cannot span). Running them overwrites activations and the
    /// KV cache at `pos`.
    pub fn decode_families(&self, pos: usize) -> Result<Vec<KernelFamily<'_>>, GpuError> {
        if pos >= self.max_ctx {
            return Err(GpuError::InvalidArgs(format!("decode position {pos} is outside the context of {}", self.max_ctx)));
        }
        let step = StepParams::new(1, pos as u32, 0);
        self.step.write(&self.gpu, &step);
        let mut groups: Vec<(&'static str, Vec<PlannedOp>)> = Vec::new();
        for op in self.plan.decode.iter().chain(&self.plan.logits).chain(&self.plan.sample).filter(|p| p.family != plan::COPY) {
            match groups.iter_mut().find(|(family, _)| *family == op.family) {
                Some((_, ops)) => ops.push(op.clone()),
                None => groups.push((op.family, vec![op.clone()])),
            }
        }
        Ok(groups
            .into_iter()
            .map(|(name, ops)| KernelFamily { name, record: Box::new(move |rec: &mut Recorder| plan::record(rec, &ops, &step)) })
            .collect())
    }

    /// Runs one decode step of `token` at `pos` and times its host side.
    pub async fn time_decode_step(&self, token: u32, pos: usize) -> Result<StepHostTime, GpuError> {
        let start = Instant::now();
        self.submit_step(StepInput::Decode(token), StepAt::prompt(pos), &StepOutput::Token)?;
        let encode_submit_ms = start.elapsed().as_secs_f64() * 1e3;
        self.read_token(0).await?;
        Ok(StepHostTime { encode_submit_ms, total_ms: start.elapsed().as_secs_f64() * 1e3 })
    }
}
