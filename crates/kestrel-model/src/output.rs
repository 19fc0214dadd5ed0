//! What a generation's sampled tokens become: the end-of-generation check, streamed text (a
//! split character or a stop string's prefix held back, a stop string cut), the lists of tokens
//! and log-probabilities, and the timings. `Model::generate` and batched sequences
//! (`sequences.rs`) both feed their tokens through it.

use std::time::Duration;

use kestrel_tokenizer::{StreamDecoder, Tokenizer};

use crate::model::{StepLogprobs, Timings, TokenEvent};
use crate::pacing::SubmitReport;
use crate::stop::StopMatcher;
use crate::{GenerateOptions, ModelError};

pub(crate) struct TokenOutput {
    stops: StopMatcher,
    decoder: StreamDecoder,
    pub generated: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<StepLogprobs>,
    stopped_by_string: bool,
}

/// What a sampled token did.
pub(crate) enum Accepted {
    /// An end-of-generation token (EOS or a stop id): generation ends without it.
    End,
    /// A generated token and the text it completes; `stopped` when that text reached a stop
    /// string (generation ends with it).
    Token { event: TokenEvent, stopped: bool },
}

impl TokenOutput {
    pub fn new(options: &GenerateOptions) -> Self {
        Self {
            stops: StopMatcher::new(&options.stop),
            decoder: StreamDecoder::new(),
            generated: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            stopped_by_string: false,
        }
    }

    pub fn accept(
        &mut self,
        tokenizer: &Tokenizer,
        options: &GenerateOptions,
        token: u32,
        logprobs: Option<StepLogprobs>,
    ) -> Result<Accepted, ModelError> {
        if (!options.ignore_eos && tokenizer.is_eog(token)) || options.stop_token_ids.contains(&token) {
            return Ok(Accepted::End);
        }
        self.generated.push(token);
        let piece = self.decoder.push(tokenizer, token)?;
        let out = self.stops.push(&piece);
        self.text.push_str(&out.text);
        let event = TokenEvent { id: Some(token), text: out.text, logprobs: logprobs.clone() };
        self.logprobs.extend(logprobs);
        self.stopped_by_string = out.stopped;
        Ok(Accepted::Token { event, stopped: out.stopped })
    }

    /// At the end: the text still held back (none after a stop string), added to the text.
    pub fn flush(&mut self) -> Option<TokenEvent> {
        if self.stopped_by_string {
            return None;
        }
        let out = self.stops.push(&self.decoder.finish());
        let rest = if out.stopped { out.text } else { out.text + &self.stops.finish() };
        if rest.is_empty() {
            return None;
        }
        self.text.push_str(&rest);
        Some(TokenEvent { id: None, text: rest, logprobs: None })
    }
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
