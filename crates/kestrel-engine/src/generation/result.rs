//! What a generation gives its caller: each token as it streams, and the finished generation
//! with why it ended. Both are also the wire format the wasm engine hands the browser package.

use serde::{Deserialize, Serialize};

use super::logprobs::StepLogprobs;
use super::speculation::SpeculativeStats;
use super::timings::Timings;
use super::tools::ToolCall;

/// Why generation ended, named as OpenAI's API names it ("abort" for a cancelled request); on
/// the wire the lowercase name ("stop", "length", "abort").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    /// The model stopped after calling tools (`Generation::tool_calls`).
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// One generated token, as streamed to the caller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenEvent {
    /// None for the final flush of text held back (a split character or a stop-string prefix).
    pub id: Option<u32>,
    /// Text completed by this token (may be empty: a split character or a held stop prefix).
    pub text: String,
    pub logprobs: Option<StepLogprobs>,
}

/// A finished generation. On the wire (what the wasm engine resolves to) `{text,
/// prompt_token_ids, token_ids, finish_reason, logprobs, timings}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    #[serde(rename = "prompt_token_ids")]
    pub prompt_tokens: Vec<u32>,
    #[serde(rename = "token_ids")]
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    pub logprobs: Vec<StepLogprobs>,
    /// The calls of a request with `tools`; `text` is then the content around them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// What speculative decoding drafted and kept, where it served the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeStats>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::logprobs::StepLogprobs;
    use crate::generation::timings::Timings;

    /// The result as the wasm engine hands it to the browser package (www/index.js reads these
    /// names).
    #[test]
    fn generation_wire_format() {
        let g = Generation {
            prompt_tokens: vec![1, 2],
            tokens: vec![3],
            text: "hi".into(),
            finish_reason: FinishReason::Length,
            timings: Timings { prompt_tokens: 2, decode_tokens: 1, ..Timings::default() },
            logprobs: vec![StepLogprobs {
                token: 3,
                logprob: -0.5,
                bytes: b"hi".to_vec(),
                top: vec![(3, -0.5), (4, f32::NEG_INFINITY)],
                top_bytes: vec![b"hi".to_vec(), vec![0xe2]],
            }],
            tool_calls: Vec::new(),
            speculative: None,
        };
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!(json["prompt_token_ids"], serde_json::json!([1, 2]));
        assert_eq!(json["token_ids"], serde_json::json!([3]));
        assert_eq!(json["finish_reason"], "length");
        assert_eq!(
            json["logprobs"],
            serde_json::json!([{ "token_id": 3, "logprob": -0.5, "bytes": [104, 105], "top": [[3, -0.5], [4, null]], "top_bytes": [[104, 105], [0xe2]] }])
        );
        let timings = json["timings"].as_object().unwrap();
        for key in [
            "prompt_tokens",
            "prefill_tokens",
            "reused_tokens",
            "ttft_ms",
            "prefill_tok_s",
            "decode_tokens",
            "decode_ms",
            "decode_tok_s",
            "host_wait_ms_per_token",
            "prefill_submissions",
            "longest_prefill_submission_ms",
            "e2e_ms",
        ] {
            assert!(timings.contains_key(key), "timings.{key}");
        }
        assert_eq!(timings.len(), 12);
        for (reason, name) in [
            (FinishReason::Stop, "stop"),
            (FinishReason::Length, "length"),
            (FinishReason::Abort, "abort"),
            (FinishReason::ToolCalls, "tool_calls"),
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), name);
            assert_eq!(reason.as_str(), name);
        }
    }
}
