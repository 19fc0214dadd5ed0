//! Benchmark hooks into a decode step (`kestrel bench model`): the step's dispatches grouped by
//! kernel family, to be timed one family at a time, and the host time to encode and submit a
//! step. Kept apart from `submit_step` so the hot path carries no instrumentation.

use kestrel_gpu::{GpuError, Recorder, StepParams};
use web_time::Instant;

use super::{Graph, StepInput, StepOutput};

/// One kernel family of a decode step: `record` records that family's dispatches for every
/// layer, exactly as the step binds them.
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
    /// Writes the step uniform of a one-token step at `pos` and returns that step's dispatches
    /// by family (copies excluded: they end a compute pass, which per-pass timestamps cannot
    /// span). Running them overwrites activations and the KV cache at `pos`.
    pub fn decode_families(&self, pos: usize) -> Result<Vec<KernelFamily<'_>>, GpuError> {
        if pos >= self.max_ctx {
            return Err(GpuError::InvalidArgs(format!("decode position {pos} is outside the context of {}", self.max_ctx)));
        }
        let params = StepParams::new(1, pos as u32, 0);
        self.step.write(&self.gpu, &params);
        let kv_len = params.kv_len;
        Ok(vec![
            family("embedding", Box::new(|rec| self.embed.iter().for_each(|e| e.record(rec, 1)))),
            family(
                "rmsnorm",
                Box::new(|rec| {
                    self.layers.iter().for_each(|l| {
                        l.attn_norm.record(rec, 1);
                        l.qk_norm.iter().for_each(|d| d.record(rec, 1));
                        l.attn_post_norm.iter().for_each(|d| d.record(rec, 1));
                        l.ffn_norm.record(rec, 1);
                        l.ffn_post_norm.iter().for_each(|d| d.record(rec, 1));
                    });
                    self.output_norm.record(rec, 1);
                }),
            ),
            family("matvec qkv", Box::new(|rec| self.layers.iter().for_each(|l| l.qkv_decode.record(rec)))),
            family("rope", Box::new(|rec| self.layers.iter().for_each(|l| l.rope.record(rec, 1)))),
            family("attention", Box::new(move |rec| self.layers.iter().for_each(|l| l.attn_decode.record(rec, kv_len)))),
            family("matvec o", Box::new(|rec| self.layers.iter().for_each(|l| l.o_decode.record(rec)))),
            family("matvec gate+up swiglu", Box::new(|rec| self.layers.iter().for_each(|l| l.gate_up_decode.record(rec)))),
            family("matvec down", Box::new(|rec| self.layers.iter().for_each(|l| l.down_decode.record(rec)))),
            family("matvec lm head", Box::new(|rec| self.lm_head.iter().for_each(|d| d.record(rec)))),
            family(
                "penalties+sample",
                Box::new(|rec| {
                    self.penalties.record(rec);
                    self.sampler.record(rec);
                }),
            ),
        ])
    }

    /// Runs one decode step of `token` at `pos` and times its host side.
    pub async fn time_decode_step(&self, token: u32, pos: usize) -> Result<StepHostTime, GpuError> {
        let start = Instant::now();
        self.submit_step(StepInput::Tokens(&[token]), pos, 0, &StepOutput::Token, 0)?;
        let encode_submit_ms = start.elapsed().as_secs_f64() * 1e3;
        self.read_token(0).await?;
        Ok(StepHostTime { encode_submit_ms, total_ms: start.elapsed().as_secs_f64() * 1e3 })
    }
}

fn family<'a>(name: &'static str, record: Box<dyn Fn(&mut Recorder) + 'a>) -> KernelFamily<'a> {
    KernelFamily { name, record }
}
