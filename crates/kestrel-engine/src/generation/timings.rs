//! A generation's timings: prompt and decode speed, time to first token, host waits, and what a
//! paced prefill measured.

use std::time::Duration;

use kestrel_model::SubmitReport;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Tokens in the prompt (prefilled plus reused).
    pub prompt_tokens: usize,
    /// Prompt tokens actually run (the rest were reused from the KV cache).
    pub prefill_tokens: usize,
    pub reused_tokens: usize,
    /// From the start of the request to the first generated token.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    /// Time the host spent blocked waiting for decode steps' tokens, per decode token. With
    /// steps run ahead the device stays busy meanwhile; it is the GPU step time where the GPU is
    /// the bottleneck, and near zero where the host is.
    pub host_wait_ms_per_token: f64,
    /// With a submission budget on the GPU (`Model::set_submit_budget`; else null): the prompt's
    /// submissions and the longest one's time from its submit to its end.
    pub prefill_submissions: Option<usize>,
    pub longest_prefill_submission_ms: Option<f64>,
    /// From the engine receiving the request to its end, queueing included: set by the engine
    /// core's scheduler (`kestrel-engine`), which sees the request arrive; 0 from the model alone.
    #[serde(default)]
    pub e2e_ms: f64,
}

impl Timings {
    /// The timings of a generation of `prompt` tokens (`reused` of them from the cache) whose
    /// first token came after `ttft`, then `decode_tokens` more in `decode`, the host blocked
    /// for `host_wait` of it.
    pub(crate) fn measured(
        prompt: usize,
        reused: usize,
        ttft: Duration,
        decode_tokens: usize,
        decode: Duration,
        host_wait: Duration,
    ) -> Self {
        let prefill_tokens = prompt - reused;
        let per_decode_token = |secs: f64| if decode_tokens > 0 { secs / decode_tokens as f64 } else { 0.0 };
        Timings {
            prompt_tokens: prompt,
            prefill_tokens,
            reused_tokens: reused,
            ttft_ms: ttft.as_secs_f64() * 1e3,
            prefill_tok_s: prefill_tokens as f64 / ttft.as_secs_f64().max(1e-9),
            decode_tokens,
            decode_ms: decode.as_secs_f64() * 1e3,
            decode_tok_s: if decode_tokens > 0 { decode_tokens as f64 / decode.as_secs_f64().max(1e-9) } else { 0.0 },
            host_wait_ms_per_token: per_decode_token(host_wait.as_secs_f64() * 1e3),
            prefill_submissions: None,
            longest_prefill_submission_ms: None,
            e2e_ms: 0.0,
        }
    }

    /// The timings with what a paced prefill measured (`SubmitPacer`), if it ran paced.
    pub(crate) fn with_pieces(self, pieces: Option<SubmitReport>) -> Self {
        Timings {
            prefill_submissions: pieces.map(|p| p.pieces),
            longest_prefill_submission_ms: pieces.map(|p| p.longest.as_secs_f64() * 1e3),
            ..self
        }
    }
}
