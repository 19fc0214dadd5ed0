//! What a generation's sampled tokens become: the end-of-generation check, streamed text (a
//! split character or a stop string's prefix held back, a stop string cut), the lists of tokens
//! and log-probabilities, the tool calls cut out of the text (a call is never streamed as
//! content). Every sequence of the generation loop feeds its tokens
//! through it.

use kestrel_model::ModelError;
use kestrel_tokenizer::{StreamDecoder, Tokenizer};

use super::logprobs::StepLogprobs;
use super::options::GenerateOptions;
use super::result::{FinishReason, TokenEvent};
use super::stop::StopMatcher;
use super::tools::{split_calls, CallSplitter, Tool, ToolCall, ToolSyntax};

pub(crate) struct TokenOutput {
    stops: StopMatcher,
    decoder: StreamDecoder,
    pub generated: Vec<u32>,
    /// The output's text: all of it until `flush`, then the content without its tool calls.
    pub text: String,
    pub logprobs: Vec<StepLogprobs>,
    stopped_by_string: bool,
    /// Bytes of `text` streamed so far (a prefix of it: a call's text is held back).
    shown: usize,
    calls: Option<CallOutput>,
    pub tool_calls: Vec<ToolCall>,
}

/// A request with tools: the stream's splitter and what the calls are checked against.
struct CallOutput {
    splitter: CallSplitter,
    syntax: ToolSyntax,
    tools: Vec<Tool>,
    /// Makes the calls' ids (from the prompt, so that the calls of two turns differ).
    seed: u64,
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
    /// The output of a request with `options`, for a model whose template writes calls in
    /// `syntax`, of the prompt `prompt`.
    pub fn new(options: &GenerateOptions, syntax: ToolSyntax, prompt: &[u32]) -> Self {
        let calls = options.tool_use().map(|_| CallOutput {
            splitter: CallSplitter::new(syntax),
            syntax,
            tools: options.tools.clone(),
            seed: super::tools::call_seed(prompt),
        });
        Self {
            stops: StopMatcher::new(&options.stop),
            // A constrained output's text is exactly what its grammar matched.
            decoder: if options.is_constrained() { StreamDecoder::verbatim() } else { StreamDecoder::new() },
            generated: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            stopped_by_string: false,
            shown: 0,
            calls,
            tool_calls: Vec::new(),
        }
    }

    /// The part of the next `text` that is content, to stream now.
    fn content(&mut self, text: &str) -> String {
        let shown = match &mut self.calls {
            Some(calls) => calls.splitter.push(text),
            None => text.to_string(),
        };
        self.shown += shown.len();
        shown
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
        let event = TokenEvent { id: Some(token), text: self.content(&out.text), logprobs: logprobs.clone() };
        self.logprobs.extend(logprobs);
        self.stopped_by_string = out.stopped;
        Ok(Accepted::Token { event, stopped: out.stopped || self.repeated_a_call(&out.text) })
    }

    /// Whether `added`, the newest text, closed a call that repeats an earlier one: the output
    /// ends there (see `tools::repeats_a_call`).
    fn repeated_a_call(&self, added: &str) -> bool {
        self.calls.as_ref().is_some_and(|calls| {
            calls.splitter.in_call() && added.contains('>') && super::tools::repeats_a_call(calls.syntax, &calls.tools, &self.text)
        })
    }

    /// At the end: the content still held back (none after a stop string), and the tool calls
    /// cut out of the text. A call cut off by `max_tokens` is dropped (see `split_calls`).
    pub fn flush(&mut self) -> Option<TokenEvent> {
        let rest = if self.stopped_by_string {
            String::new()
        } else {
            let out = self.stops.push(&self.decoder.finish());
            if out.stopped {
                out.text
            } else {
                out.text + &self.stops.finish()
            }
        };
        self.text.push_str(&rest);
        let mut shown = self.content(&rest);
        if let Some(calls) = &mut self.calls {
            let held = calls.splitter.finish();
            self.shown += held.len();
            shown.push_str(&held);
            if calls.splitter.in_call() {
                // The content begins with what was streamed; the rest of it (a call cut off, or
                // text that is no call) streams now.
                let (content, found) = split_calls(calls.syntax, &calls.tools, &self.text, calls.seed);
                shown.push_str(content.get(self.shown..).unwrap_or_default());
                self.shown = content.len();
                self.text = content;
                self.tool_calls = found;
            } else {
                // The content is what streamed: the splitter kept back only a cut call's opening.
                self.text.truncate(self.shown);
            }
        }
        (!shown.is_empty()).then_some(TokenEvent { id: None, text: shown, logprobs: None })
    }

    /// How the generation ended: `tool_calls` where it stopped after making calls.
    pub fn finish_reason(&self, reason: FinishReason) -> FinishReason {
        if reason == FinishReason::Stop && !self.tool_calls.is_empty() {
            FinishReason::ToolCalls
        } else {
            reason
        }
    }
}
