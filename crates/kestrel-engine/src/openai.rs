//! OpenAI's request and response shapes over Kestrel's own, once for every front end: the npm
//! package's `chat.completions.create` / `completions.create` (local and remote engines alike)
//! and `kestrel serve`'s `/v1/chat/completions` and `/v1/completions`. The envelope fields
//! (`stream`, `n`, `logprobs`, ...) are taken here, and everything else is the generation
//! [`Request`] (the same options, defaults and errors). Answers are built here too, as JSON
//! values: streamed chunks, the whole completion, the usage with its details.

use kestrel_model::{ChatFunctionCall, ChatMessage, ChatToolCall};
use serde_json::{json, Map, Value};

use crate::generation::options::{Allowed, MAX_LOGPROBS};
use crate::generation::{FinishReason, Generation, StepLogprobs, TokenEvent};
use crate::{body, EngineError, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// The endpoint a front end names: `chat` or `completions`.
    pub fn from_name(name: &str) -> Option<Endpoint> {
        match name {
            "chat" => Some(Self::Chat),
            "completions" => Some(Self::Completions),
            _ => None,
        }
    }

    /// The label in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat_completions",
            Self::Completions => "completions",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Self::Chat => "chatcmpl",
            Self::Completions => "cmpl",
        }
    }

    fn chunk_object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion.chunk",
            Self::Completions => "text_completion",
        }
    }
}

/// A parsed request to one of the two generation endpoints.
#[derive(Debug)]
pub struct ApiRequest {
    pub request: Request,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with no choices and the usage.
    pub include_usage: bool,
}

/// Envelope fields that change nothing here: accepted and dropped.
const IGNORED: [&str; 4] = ["model", "user", "metadata", "store"];

/// Roles a chat template knows. OpenAI's `developer` is its newer name for `system`; `tool`
/// carries a tool's result.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Parses an endpoint's body given as JSON bytes (a bad body is `invalid_json`).
pub fn parse_body(endpoint: Endpoint, body: &[u8]) -> Result<ApiRequest, EngineError> {
    parse(endpoint, body::json(body)?)
}

/// Parses an endpoint's body. A field set to `null` is the same as an absent one.
pub fn parse(endpoint: Endpoint, value: Value) -> Result<ApiRequest, EngineError> {
    let mut fields = body::fields(value)?;
    for name in IGNORED {
        fields.remove(name);
    }
    let stream = take_bool(&mut fields, "stream")?;
    let include_usage = match fields.remove("stream_options") {
        None => false,
        Some(Value::Object(mut options)) => take_bool(&mut options, "include_usage")?,
        Some(_) => return Err(EngineError::invalid("stream_options", "stream_options must be an object")),
    };
    match fields.remove("n") {
        None => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) => return Err(EngineError::invalid("n", format!("invalid option n: must be 1 (one choice per request), got {n}"))),
    }
    // OpenAI's newer name for `max_tokens`, checked under the name the request used.
    if let Some(max) = fields.remove("max_completion_tokens") {
        let max = Allowed::MAX_TOKENS.count("max_completion_tokens", &max)?;
        fields.entry("max_tokens").or_insert(json!(max));
    }
    take_logprobs(&mut fields)?;
    match endpoint {
        Endpoint::Chat => {
            let messages = fields.remove("messages").ok_or_else(|| EngineError::invalid("messages", "messages is required"))?;
            if fields.contains_key("prompt") {
                return Err(EngineError::invalid("prompt", "prompt is not a chat completions field; use completions"));
            }
            fields.insert("messages".into(), chat_messages(messages)?);
        }
        Endpoint::Completions => {
            // A prompt may come as a list of one.
            let not_text = || EngineError::invalid("prompt", "prompt must be a string (or a list of one string)");
            let prompt = match fields.remove("prompt") {
                Some(Value::String(text)) => text,
                Some(Value::Array(list)) => match <[Value; 1]>::try_from(list) {
                    Ok([Value::String(text)]) => text,
                    _ => return Err(not_text()),
                },
                Some(_) => return Err(not_text()),
                None => return Err(EngineError::invalid("prompt", "prompt is required")),
            };
            if fields.contains_key("messages") {
                return Err(EngineError::invalid("messages", "messages is not a completions field; use chat completions"));
            }
            fields.insert("prompt".into(), Value::String(prompt));
        }
    }
    let request = Request::from_value(Value::Object(fields))?;
    Ok(ApiRequest { request, stream, include_usage })
}

/// `logprobs` as the engine takes it: the number of most likely tokens each step reports. Chat
/// requests (and the npm package's) give a flag and `top_logprobs` the count; OpenAI's text
/// completions give the count itself. Either count is checked under the name the request used.
fn take_logprobs(fields: &mut Map<String, Value>) -> Result<(), EngineError> {
    let top = fields.remove("top_logprobs").map(|top| Allowed::LOGPROBS.count("top_logprobs", &top)).transpose()?;
    let count = match fields.remove("logprobs") {
        None | Some(Value::Bool(false)) => return Ok(()),
        // The engine reports the best token of each step with it: `top_logprobs: 0` shows one.
        Some(Value::Bool(true)) => top.unwrap_or(1).max(1),
        Some(Value::Number(n)) => match Allowed::LOGPROBS.count("logprobs", &Value::Number(n))? {
            0 => return Ok(()),
            n => n,
        },
        Some(other) => {
            return Err(EngineError::invalid(
                "logprobs",
                format!("invalid option logprobs: must be true or false, or an integer from 0 to {MAX_LOGPROBS}, got {other}"),
            ))
        }
    };
    fields.insert("logprobs".into(), json!(count));
    Ok(())
}

fn take_bool(fields: &mut Map<String, Value>, name: &'static str) -> Result<bool, EngineError> {
    match fields.remove(name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(b),
        Some(other) => Err(EngineError::invalid(name, format!("{name} must be a boolean, got {other}"))),
    }
}

/// OpenAI's messages as the chat template takes them: a known role and text content (a string,
/// or a list of text parts, which are joined); an assistant's `tool_calls` (its content may then
/// be absent), with their arguments read from JSON text into the object templates expect; a
/// `tool` message's `tool_call_id`.
fn chat_messages(messages: Value) -> Result<Value, EngineError> {
    let bad = |message: String| EngineError::invalid("messages", message);
    let Value::Array(messages) = messages else { return Err(bad("messages must be a list".into())) };
    if messages.is_empty() {
        return Err(bad("messages must not be empty".into()));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).ok_or_else(|| bad(format!("messages[{i}].role must be a string")))?;
        if !ROLES.contains(&role) {
            return Err(bad(format!("messages[{i}].role {role:?} is not one of {}", ROLES.join(", "))));
        }
        let role = if role == "developer" { "system" } else { role };
        let tool_calls = match message.get("tool_calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(calls) if role == "assistant" => tool_calls(calls).map_err(|e| bad(format!("messages[{i}].tool_calls: {e}")))?,
            Some(_) => return Err(bad(format!("messages[{i}].tool_calls: only an assistant message makes tool calls"))),
        };
        let content = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(piece)) => text.push_str(piece),
                        _ => return Err(bad(format!("messages[{i}].content: only text parts are supported"))),
                    }
                }
                text
            }
            None | Some(Value::Null) if !tool_calls.is_empty() => String::new(),
            _ => return Err(bad(format!("messages[{i}].content must be a string or a list of text parts"))),
        };
        let mut chat = ChatMessage::new(role, content);
        chat.tool_calls = tool_calls;
        if role == "tool" {
            let id = message.get("tool_call_id").and_then(Value::as_str);
            chat.tool_call_id = Some(id.ok_or_else(|| bad(format!("messages[{i}].tool_call_id must be a string")))?.to_string());
        }
        out.push(chat);
    }
    serde_json::to_value(out).map_err(|e| bad(e.to_string()))
}

/// An assistant message's `tool_calls`: `[{id, type: "function", function: {name, arguments}}]`,
/// the arguments JSON text (kept as text where it is not JSON).
fn tool_calls(calls: &Value) -> Result<Vec<ChatToolCall>, String> {
    let Value::Array(calls) = calls else { return Err("must be a list".into()) };
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let text = |key: &str| call.get(key).and_then(Value::as_str);
            let function = call.get("function").ok_or_else(|| format!("[{i}].function is missing"))?;
            let name = function.get("name").and_then(Value::as_str).ok_or_else(|| format!("[{i}].function.name must be a string"))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(args)) => serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.clone())),
                None => json!({}),
                Some(other) => other.clone(),
            };
            Ok(ChatToolCall {
                id: text("id").unwrap_or_default().to_string(),
                kind: text("type").unwrap_or("function").to_string(),
                function: ChatFunctionCall { name: name.to_string(), arguments },
            })
        })
        .collect()
}

/// What the responses of one request share.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// `serial` numbers the requests of one engine; `created` is the Unix time in seconds. The id
    /// is `{prefix}-{serial}-{created in hex}`: it orders one engine's requests, and the time keeps
    /// those of an engine started again apart.
    pub fn new(endpoint: Endpoint, serial: u64, created: u64, model: &str) -> Self {
        Self { endpoint, id: format!("{}-{serial}-{created:x}", endpoint.id_prefix()), created, model: model.to_string() }
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "system_fingerprint": null, "choices": choices })
    }

    /// A chat stream's first chunk: the role, as OpenAI sends it before the content.
    fn role_chunk(&self) -> Value {
        let choice = json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null });
        self.envelope(self.endpoint.chunk_object(), json!([choice]))
    }

    /// A streamed chunk of text, with the token it came from (None: held-back text flushed) and
    /// its `logprobs`.
    fn chunk(&self, text: &str, token_id: Option<u32>, logprobs: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({ "index": 0, "delta": { "content": text }, "logprobs": logprobs, "finish_reason": null, "token_id": token_id })
            }
            Endpoint::Completions => json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": null, "token_id": token_id }),
        };
        self.envelope(self.endpoint.chunk_object(), json!([choice]))
    }

    /// A chat stream's tool calls, each whole in one delta with its `index` (OpenAI's clients
    /// join the deltas of one index; here there is one each).
    fn tool_calls_chunk(&self, generation: &Generation) -> Value {
        let calls: Vec<Value> = generation
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| json!({ "index": index, "id": call.id, "type": call.kind, "function": call.function }))
            .collect();
        let choice = json!({ "index": 0, "delta": { "tool_calls": calls }, "logprobs": null, "finish_reason": null });
        self.envelope(self.endpoint.chunk_object(), json!([choice]))
    }

    /// The stream's last chunk with a choice: its finish reason, the `logprobs` of steps no
    /// chunk carried yet, the usage and Kestrel's details.
    fn final_chunk(&self, generation: &Generation, logprobs: Value, cache_hit: Option<bool>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({ "index": 0, "delta": {}, "logprobs": logprobs, "finish_reason": generation.finish_reason }),
            Endpoint::Completions => json!({ "index": 0, "text": "", "logprobs": logprobs, "finish_reason": generation.finish_reason }),
        };
        let mut chunk = self.envelope(self.endpoint.chunk_object(), json!([choice]));
        chunk["usage"] = usage(generation, cache_hit);
        chunk["kestrel"] = details(generation, cache_hit);
        chunk
    }

    /// `stream_options.include_usage`'s chunk: no choices, the usage.
    fn usage_chunk(&self, generation: &Generation, cache_hit: Option<bool>) -> Value {
        let mut chunk = self.envelope(self.endpoint.chunk_object(), json!([]));
        chunk["usage"] = usage(generation, cache_hit);
        chunk
    }

    /// The whole answer of a request that did not stream, with its `logprobs`.
    fn completion(&self, generation: &Generation, logprobs: Value, cache_hit: Option<bool>) -> Value {
        let mut body = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({ "role": "assistant", "content": generation.text });
                if !generation.tool_calls.is_empty() {
                    message["tool_calls"] = json!(generation.tool_calls);
                    if generation.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                self.envelope(
                    "chat.completion",
                    json!([{ "index": 0, "message": message, "logprobs": logprobs, "finish_reason": generation.finish_reason }]),
                )
            }
            Endpoint::Completions => self.envelope(
                "text_completion",
                json!([{ "index": 0, "text": generation.text, "logprobs": logprobs, "finish_reason": generation.finish_reason }]),
            ),
        };
        body["usage"] = usage(generation, cache_hit);
        body["kestrel"] = details(generation, cache_hit);
        body
    }
}

/// One request's answer as it is written: the engine's events in, OpenAI's JSON values out.
#[derive(Debug)]
pub struct Answer {
    pub meta: ResponseMeta,
    pub stream: bool,
    pub include_usage: bool,
    /// Whether a chat stream has sent its role chunk.
    opened: bool,
    /// The generated steps whose log-probabilities are written.
    steps_written: usize,
    /// A text completion's `text_offset` of the next step: the characters of those written.
    text_offset: usize,
}

impl Answer {
    pub fn new(meta: ResponseMeta, stream: bool, include_usage: bool) -> Self {
        Self { meta, stream, include_usage, opened: false, steps_written: 0, text_offset: 0 }
    }

    /// The chunks a token gives when streaming (a chat's role chunk first), with its
    /// log-probabilities where the request asked for them: nothing for a whole answer, nor for a
    /// flush with no text.
    pub fn on_token(&mut self, token: &TokenEvent) -> Vec<Value> {
        if !self.streams(token) {
            return Vec::new();
        }
        let logprobs = self.logprobs(token.logprobs.as_slice());
        self.token_chunks(token, logprobs)
    }

    /// [`Answer::on_token`] for a token relayed from a remote server (a remote engine's), whose
    /// chunk carried `logprobs` in OpenAI's shape for the endpoint: written as the server wrote
    /// them (it has the tokenizer; the remote engine has none), and counted as written.
    pub fn on_relayed_token(&mut self, token: &TokenEvent, logprobs: Value) -> Vec<Value> {
        if !self.streams(token) {
            return Vec::new();
        }
        let tokens = match self.meta.endpoint {
            Endpoint::Chat => logprobs.get("content"),
            Endpoint::Completions => logprobs.get("tokens"),
        };
        for token in tokens.and_then(Value::as_array).into_iter().flatten() {
            self.steps_written += 1;
            let text = token.get("token").unwrap_or(token).as_str().unwrap_or_default();
            self.text_offset += text.chars().count();
        }
        self.token_chunks(token, logprobs)
    }

    /// Whether `token` gives chunks: in a stream, a token or a flush with text.
    fn streams(&self, token: &TokenEvent) -> bool {
        self.stream && (token.id.is_some() || !token.text.is_empty())
    }

    /// A streamed token's chunks (a chat's role chunk first).
    fn token_chunks(&mut self, token: &TokenEvent, logprobs: Value) -> Vec<Value> {
        let mut out = self.open();
        out.push(self.meta.chunk(&token.text, token.id, logprobs));
        out
    }

    /// What the end gives: streamed, the final chunk (and the usage chunk with `include_usage`);
    /// whole, the completion. `cache_hit`: whether a response cache answered (a server's; None
    /// where there is none).
    pub fn on_done(&mut self, generation: &Generation, cache_hit: Option<bool>) -> Vec<Value> {
        // Steps whose tokens came with no log-probabilities (a stored answer streamed as one
        // chunk, a remote server's stream) come with the end: a stream's chunks carry all steps.
        let rest = generation.logprobs.get(self.steps_written..).unwrap_or_default();
        let logprobs = self.logprobs(rest);
        if !self.stream {
            return vec![self.meta.completion(generation, logprobs, cache_hit)];
        }
        let mut out = self.open();
        if self.meta.endpoint == Endpoint::Chat && !generation.tool_calls.is_empty() {
            out.push(self.meta.tool_calls_chunk(generation));
        }
        out.push(self.meta.final_chunk(generation, logprobs, cache_hit));
        if self.include_usage {
            out.push(self.meta.usage_chunk(generation, cache_hit));
        }
        out
    }

    fn open(&mut self) -> Vec<Value> {
        if self.meta.endpoint != Endpoint::Chat || std::mem::replace(&mut self.opened, true) {
            return Vec::new();
        }
        vec![self.meta.role_chunk()]
    }

    /// A choice's `logprobs` for the next `steps` of the answer, in OpenAI's shape for the
    /// endpoint; null for none (a request that asked for none, a chunk of no token).
    fn logprobs(&mut self, steps: &[StepLogprobs]) -> Value {
        if steps.is_empty() {
            return Value::Null;
        }
        self.steps_written += steps.len();
        match self.meta.endpoint {
            Endpoint::Chat => chat_logprobs(steps),
            Endpoint::Completions => text_logprobs(steps, &mut self.text_offset),
        }
    }
}

/// A token's text as OpenAI's answers show it: a token holding part of a UTF-8 character shows
/// U+FFFD for it (its `bytes`, in the chat shape, hold it exactly).
fn token_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// OpenAI's chat shape: `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob,
/// bytes}]}], refusal}`.
fn chat_logprobs(steps: &[StepLogprobs]) -> Value {
    let entry = |bytes: &[u8], logprob: f32| json!({ "token": token_text(bytes), "logprob": logprob, "bytes": bytes });
    let content: Vec<Value> = steps
        .iter()
        .map(|step| {
            let mut chosen = entry(&step.bytes, step.logprob);
            chosen["top_logprobs"] = step.top.iter().zip(&step.top_bytes).map(|(&(_, logprob), bytes)| entry(bytes, logprob)).collect();
            chosen
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// OpenAI's text completions' shape: `{tokens, token_logprobs, top_logprobs: [{token: logprob}],
/// text_offset}`, the offsets in characters of the answer's text from `offset` on (which this
/// moves past the steps).
fn text_logprobs(steps: &[StepLogprobs], offset: &mut usize) -> Value {
    let tokens: Vec<String> = steps.iter().map(|step| token_text(&step.bytes)).collect();
    let text_offset: Vec<usize> = tokens
        .iter()
        .map(|token| {
            let at = *offset;
            *offset += token.chars().count();
            at
        })
        .collect();
    let top: Vec<Map<String, Value>> = steps
        .iter()
        .map(|step| {
            let mut by_text = Map::new();
            // Two tokens of one text (parts of different characters): the likelier one, listed first.
            for (&(_, logprob), bytes) in step.top.iter().zip(&step.top_bytes) {
                by_text.entry(token_text(bytes)).or_insert(json!(logprob));
            }
            by_text
        })
        .collect();
    let token_logprobs: Vec<f32> = steps.iter().map(|step| step.logprob).collect();
    json!({ "tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset })
}

/// OpenAI's usage: token counts, the prompt tokens the KV cache already held, and Kestrel's
/// speeds and latencies (`extra`); with a response cache, whether it answered.
fn usage(generation: &Generation, cache_hit: Option<bool>) -> Value {
    let prompt = generation.prompt_tokens.len();
    let completion = generation.tokens.len();
    let t = &generation.timings;
    let per_token = if t.decode_tokens > 0 { t.decode_ms / 1e3 / t.decode_tokens as f64 } else { 0.0 };
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": t.reused_tokens },
        "extra": {
            "prefill_tokens": t.prefill_tokens,
            "reused_tokens": t.reused_tokens,
            "prefill_tokens_per_s": t.prefill_tok_s,
            "decode_tokens_per_s": t.decode_tok_s,
            "time_to_first_token_s": t.ttft_ms / 1e3,
            "time_per_output_token_s": per_token,
            "host_wait_per_output_token_s": t.host_wait_ms_per_token / 1e3,
            "prefill_submissions": t.prefill_submissions,
            "longest_prefill_submission_s": t.longest_prefill_submission_ms.map(|ms| ms / 1e3),
            "e2e_latency_s": t.e2e_ms / 1e3,
        },
    });
    if let Some(hit) = cache_hit {
        usage["response_cache_hit"] = json!(hit);
    }
    usage
}

/// Kestrel's own details of a generation (`kestrel`): token ids, timings, log-probabilities,
/// and where speculative decoding served it, what it drafted and kept. The log-probabilities are
/// also the choice's, in OpenAI's shape; these carry more: the ids of the tokens and their
/// alternatives (the remote engine writes its answers from them).
fn details(generation: &Generation, cache_hit: Option<bool>) -> Value {
    let mut details = json!({
        "prompt_token_ids": generation.prompt_tokens,
        "token_ids": generation.tokens,
        "timings": generation.timings,
        "logprobs": generation.logprobs,
    });
    if let Some(stats) = &generation.speculative {
        details["speculative"] = json!(stats);
    }
    if let Some(hit) = cache_hit {
        details["response_cache_hit"] = json!(hit);
    }
    details
}

/// Whether a result may be stored in a response cache: a whole answer.
pub fn is_complete(generation: &Generation) -> bool {
    generation.finish_reason != FinishReason::Abort
}

#[cfg(test)]
mod tests {
    use crate::generation::speculation::SpeculativeStats;
    use crate::generation::Timings;

    use super::*;

    fn parsed(endpoint: Endpoint, body: Value) -> Result<ApiRequest, EngineError> {
        parse(endpoint, body)
    }

    fn generation() -> Generation {
        let timings = Timings {
            prompt_tokens: 3,
            prefill_tokens: 1,
            reused_tokens: 2,
            decode_tokens: 1,
            decode_ms: 4.0,
            e2e_ms: 9.0,
            ..Timings::default()
        };
        Generation {
            prompt_tokens: vec![1, 2, 3],
            tokens: vec![7, 8],
            text: "hi!".into(),
            finish_reason: FinishReason::Length,
            timings,
            logprobs: Vec::new(),
            tool_calls: Vec::new(),
            speculative: None,
        }
    }

    #[test]
    fn both_endpoints_take_openai_bodies_and_refuse_mistakes() {
        let chat = parsed(
            Endpoint::Chat,
            json!({"model": "x", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                   "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 5, "n": 1}),
        )
        .expect("a chat body");
        assert!(chat.stream && chat.include_usage);
        let messages = chat.request.messages.as_ref().expect("messages");
        assert_eq!((messages[0].role.as_str(), messages[0].content.as_str()), ("system", "ab"));
        assert_eq!((chat.request.options.logprobs, chat.request.options.max_tokens), (3, 5));
        // Text completions: the count itself, or the package's flag; a list of one prompt.
        let text = parsed(Endpoint::Completions, json!({"prompt": ["p"], "logprobs": 2})).expect("a completions body");
        assert_eq!((text.request.prompt.as_deref(), text.request.options.logprobs, text.stream), (Some("p"), 2, false));
        let flag = parsed(Endpoint::Completions, json!({"prompt": "p", "logprobs": true})).expect("the package's flag");
        assert_eq!(flag.request.options.logprobs, 1);
        let code = |endpoint, body| parsed(endpoint, body).map(|_| ()).expect_err("refused");
        assert_eq!(code(Endpoint::Chat, json!({"prompt": "p"})).param.as_deref(), Some("messages"));
        assert_eq!(code(Endpoint::Chat, json!({"messages": [{"role": "x", "content": "c"}]})).param.as_deref(), Some("messages"));
        assert_eq!(code(Endpoint::Completions, json!({"prompt": "p", "n": 2})).param.as_deref(), Some("n"));
        assert_eq!(code(Endpoint::Completions, json!({"prompt": "p", "stream": "yes"})).param.as_deref(), Some("stream"));
        assert_eq!(code(Endpoint::Completions, json!({"prompt": "p", "logprobs": -1})).param.as_deref(), Some("logprobs"));
        assert_eq!(code(Endpoint::Completions, json!({"prompt": "p", "max_token": 3})).code, "invalid_option");
        assert_eq!(code(Endpoint::Completions, json!("p")).code, "invalid_json");
    }

    /// OpenAI's `response_format` and Kestrel's `regex` and `grammar` reach the options as
    /// given; a malformed one is refused before any model sees it.
    #[test]
    fn constraints_come_through_both_endpoints() {
        use crate::generation::OutputConstraint;
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let chat = parsed(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "c"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}}),
        )
        .expect("a schema");
        match chat.request.options.constraint().expect("one constraint") {
            Some(OutputConstraint::JsonSchema(format)) => assert_eq!((format.name.as_str(), format.schema.as_ref()), ("n", Some(&schema))),
            other => panic!("{other:?}"),
        }
        let object =
            parsed(Endpoint::Chat, json!({"messages": [{"role": "user", "content": "c"}], "response_format": {"type": "json_object"}}))
                .expect("json_object");
        assert_eq!(object.request.options.constraint().expect("one"), Some(OutputConstraint::JsonObject));
        let text =
            parsed(Endpoint::Completions, json!({"prompt": "p", "response_format": {"type": "text"}, "regex": "[0-9]+"})).expect("regex");
        assert_eq!(text.request.options.constraint().expect("one"), Some(OutputConstraint::Regex("[0-9]+")));
        let lark = parsed(Endpoint::Completions, json!({"prompt": "p", "grammar": "start: \"yes\" | \"no\""})).expect("grammar");
        assert_eq!(lark.request.options.constraint().expect("one"), Some(OutputConstraint::Grammar("start: \"yes\" | \"no\"")));
        // Refused when parsed, or by the checks every front end runs before a model sees it.
        let refused =
            |body: Value| parsed(Endpoint::Completions, body).and_then(|api| api.request.validate_for_any_model()).expect_err("refused");
        for body in [
            json!({"prompt": "p", "response_format": {"type": "yaml"}}),
            json!({"prompt": "p", "response_format": {"type": "json_schema"}}),
            json!({"prompt": "p", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": 3}}}),
            json!({"prompt": "p", "regex": "a", "grammar": "start: \"a\""}),
            json!({"prompt": "p", "regex": ""}),
        ] {
            assert_eq!(refused(body.clone()).code, "invalid_option", "{body}");
        }
    }

    /// OpenAI's tool fields reach the options; tool and assistant-call messages reach the
    /// template in its form (arguments as an object); calls come back as `message.tool_calls`
    /// (content null) and streamed as `delta.tool_calls`, with `finish_reason: "tool_calls"`.
    #[test]
    fn tool_calls_come_in_and_go_out_in_openais_shapes() {
        use crate::generation::{FunctionCall, FunctionKind, ToolCall, ToolChoice, ToolMode};
        let body = json!({"messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"}],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "parallel_tool_calls": false});
        let chat = parsed(Endpoint::Chat, body).expect("a tools body");
        chat.request.validate_for_any_model().expect("valid");
        let options = &chat.request.options;
        assert_eq!(
            (options.tools.len(), &options.tool_choice, options.parallel_tool_calls),
            (1, &Some(ToolChoice::Mode(ToolMode::Required)), Some(false))
        );
        let messages = chat.request.messages.as_ref().expect("messages");
        assert_eq!(messages[1].tool_calls[0].function.arguments, json!({"city": "Oslo"}));
        assert_eq!((messages[2].role.as_str(), messages[2].tool_call_id.as_deref()), ("tool", Some("c1")));
        let refused = |body: Value| parsed(Endpoint::Chat, body).and_then(|api| api.request.validate_for_any_model()).expect_err("refused");
        for (body, param) in [
            (json!({"messages": [{"role": "tool", "content": "x"}]}), "messages"),
            (json!({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}), "messages"),
            (json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes", "tools": []}), "request"),
            (json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}), "tool_choice"),
        ] {
            assert_eq!(refused(body.clone()).param.as_deref(), Some(param), "{body}");
        }
        assert_eq!(
            parsed(Endpoint::Completions, json!({"prompt": "p", "tools": [{"type": "function", "function": {"name": "w"}}]}))
                .and_then(|api| api.request.validate_for_any_model())
                .expect_err("tools need messages")
                .param
                .as_deref(),
            Some("tools")
        );

        let mut g = generation();
        g.text = String::new();
        g.finish_reason = FinishReason::ToolCalls;
        g.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            kind: FunctionKind::Function,
            function: FunctionCall { name: "w".into(), arguments: "{}".into() },
        }];
        let whole = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), false, false).on_done(&g, None);
        let choice = &whole[0]["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]})
        );
        let streamed = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), true, false).on_done(&g, None);
        assert_eq!(streamed.len(), 3, "the role, the calls, the end");
        assert_eq!(
            streamed[1]["choices"][0]["delta"]["tool_calls"],
            json!([{"index": 0, "id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}])
        );
        assert_eq!(streamed[2]["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_chat_stream_opens_with_the_role_and_ends_with_usage_and_details() {
        let meta = ResponseMeta::new(Endpoint::Chat, 5, 1_700_000_000, "m");
        let mut answer = Answer::new(meta, true, true);
        let first = answer.on_token(&TokenEvent { id: Some(7), text: "hi".into(), logprobs: None });
        assert_eq!(first.len(), 2, "the role chunk, then the content");
        assert_eq!(first[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(first[1]["choices"][0]["delta"], json!({"content": "hi"}));
        assert_eq!(first[1]["choices"][0]["token_id"], 7);
        assert_eq!(first[1]["object"], "chat.completion.chunk");
        assert_eq!(first[0]["id"], first[1]["id"]);
        // A token with no text still streams (its id counts); an empty flush does not.
        assert_eq!(answer.on_token(&TokenEvent { id: Some(8), text: String::new(), logprobs: None }).len(), 1);
        assert!(answer.on_token(&TokenEvent { id: None, text: String::new(), logprobs: None }).is_empty());
        let end = answer.on_done(&generation(), None);
        assert_eq!(end.len(), 2, "the final chunk, then include_usage's");
        assert_eq!(end[0]["choices"][0]["finish_reason"], "length");
        assert_eq!(end[0]["usage"]["completion_tokens"], 2);
        assert_eq!(end[0]["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
        assert_eq!(end[0]["usage"]["extra"]["time_per_output_token_s"], 0.004);
        assert_eq!(end[0]["usage"]["extra"]["e2e_latency_s"], 0.009);
        assert!(end[0]["usage"].get("response_cache_hit").is_none(), "no cache, no field");
        assert_eq!(end[0]["kestrel"]["token_ids"], json!([7, 8]));
        assert_eq!(end[1]["choices"], json!([]));
        assert_eq!(end[1]["usage"]["total_tokens"], 5);
    }

    /// Two steps of "hi!": "hi" (likeliest), then "!" (second to "?"); each with two alternatives.
    #[test]
    fn relayed_logprobs_are_written_as_the_server_wrote_them_and_not_again_at_the_end() {
        let parsed = parsed(Endpoint::Chat, json!({"messages": [{"role": "user", "content": "x"}], "stream": true, "logprobs": true}))
            .expect("a chat body");
        let mut answer = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), parsed.stream, parsed.include_usage);
        let relayed = json!({"content": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105], "top_logprobs": []}], "refusal": null});
        let chunks = answer.on_relayed_token(&TokenEvent { id: Some(7), text: "hi".into(), logprobs: None }, relayed.clone());
        assert_eq!(chunks.last().map(|c| c["choices"][0]["logprobs"].clone()), Some(relayed));
        // The end's Kestrel details list that step too: it is not written twice.
        let generation = with_logprobs();
        let end = answer.on_done(&Generation { logprobs: generation.logprobs[..1].to_vec(), ..generation }, None);
        assert!(end.iter().all(|c| c["choices"].get(0).is_none_or(|choice| choice["logprobs"].is_null())), "{end:?}");
    }

    fn with_logprobs() -> Generation {
        let step = |token: u32, text: &str, logprob: f32, top: [(u32, &str, f32); 2]| StepLogprobs {
            token,
            logprob,
            bytes: text.as_bytes().to_vec(),
            top: top.iter().map(|&(id, _, lp)| (id, lp)).collect(),
            top_bytes: top.iter().map(|&(_, text, _)| text.as_bytes().to_vec()).collect(),
        };
        Generation {
            logprobs: vec![step(7, "hi", -0.25, [(7, "hi", -0.25), (9, "yo", -1.5)]), step(8, "!", -1.0, [(3, "?", -0.5), (8, "!", -1.0)])],
            ..generation()
        }
    }

    /// The events the engine gives for `generation`'s tokens, each with its step's logprobs.
    fn token_events(generation: &Generation) -> Vec<TokenEvent> {
        let texts = ["hi", "!"];
        generation
            .logprobs
            .iter()
            .zip(texts)
            .map(|(step, text)| TokenEvent { id: Some(step.token), text: text.into(), logprobs: Some(step.clone()) })
            .collect()
    }

    /// OpenAI's chat shape: `choices[0].logprobs.content`, whole and a token's in each chunk; the
    /// Kestrel field keeps the ids.
    #[test]
    fn chat_logprobs_are_where_openai_puts_them() {
        let g = with_logprobs();
        let hi = json!({"token": "hi", "logprob": -0.25, "bytes": [104, 105],
            "top_logprobs": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105]}, {"token": "yo", "logprob": -1.5, "bytes": [121, 111]}]});
        let bang = json!({"token": "!", "logprob": -1.0, "bytes": [33],
            "top_logprobs": [{"token": "?", "logprob": -0.5, "bytes": [63]}, {"token": "!", "logprob": -1.0, "bytes": [33]}]});
        let mut whole = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), false, false);
        let out = whole.on_done(&g, None);
        assert_eq!(out[0]["choices"][0]["logprobs"], json!({"content": [hi, bang], "refusal": null}));
        assert_eq!(out[0]["kestrel"]["logprobs"][1]["top"], json!([[3, -0.5], [8, -1.0]]));

        let mut streamed = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), true, false);
        let mut chunks: Vec<Value> = token_events(&g).iter().flat_map(|t| streamed.on_token(t)).collect();
        chunks.extend(streamed.on_done(&g, None));
        let logprobs: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["logprobs"]).collect();
        assert_eq!(
            logprobs,
            [&Value::Null, &json!({"content": [hi], "refusal": null}), &json!({"content": [bang], "refusal": null}), &Value::Null],
            "the role chunk, a chunk per token, the end"
        );
    }

    /// OpenAI's text completions' shape: parallel lists, top alternatives by text, offsets into
    /// the answer's text that go on from chunk to chunk.
    #[test]
    fn text_completion_logprobs_take_the_legacy_shape() {
        let g = with_logprobs();
        let mut whole = Answer::new(ResponseMeta::new(Endpoint::Completions, 1, 0, "m"), false, false);
        assert_eq!(
            whole.on_done(&g, None)[0]["choices"][0]["logprobs"],
            json!({"tokens": ["hi", "!"], "token_logprobs": [-0.25, -1.0], "top_logprobs": [{"hi": -0.25, "yo": -1.5}, {"?": -0.5, "!": -1.0}], "text_offset": [0, 2]})
        );
        let mut streamed = Answer::new(ResponseMeta::new(Endpoint::Completions, 1, 0, "m"), true, false);
        let chunks: Vec<Value> = token_events(&g).iter().flat_map(|t| streamed.on_token(t)).collect();
        assert_eq!(
            chunks[1]["choices"][0]["logprobs"],
            json!({"tokens": ["!"], "token_logprobs": [-1.0], "top_logprobs": [{"?": -0.5, "!": -1.0}], "text_offset": [2]})
        );
        assert_eq!(streamed.on_done(&g, None)[0]["choices"][0]["logprobs"], Value::Null, "every step was streamed");
    }

    /// A stream whose tokens came without their logprobs (a stored answer replayed as one chunk,
    /// a remote server's) carries them on the final chunk; a request without logprobs has none.
    #[test]
    fn steps_not_streamed_come_with_the_end() {
        let g = with_logprobs();
        let mut replay = Answer::new(ResponseMeta::new(Endpoint::Chat, 1, 0, "m"), true, false);
        let text = replay.on_token(&TokenEvent { id: None, text: g.text.clone(), logprobs: None });
        assert_eq!(text[1]["choices"][0]["logprobs"], Value::Null);
        let end = replay.on_done(&g, None);
        let tokens: Vec<&Value> =
            end[0]["choices"][0]["logprobs"]["content"].as_array().into_iter().flatten().map(|e| &e["token"]).collect();
        assert_eq!(tokens, ["hi", "!"]);
        let plain = Answer::new(ResponseMeta::new(Endpoint::Completions, 1, 0, "m"), false, false).on_done(&generation(), None);
        assert_eq!(plain[0]["choices"][0]["logprobs"], Value::Null);
    }

    /// `top_logprobs` and `max_completion_tokens` are checked under their own names, with their
    /// ranges (the engine's options call them `logprobs` and `max_tokens`).
    #[test]
    fn openais_other_names_are_checked_under_their_own() {
        let chat = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "c"}]});
            if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
                body.extend(extra);
            }
            parsed(Endpoint::Chat, body)
        };
        for (extra, param, message) in [
            (
                json!({"logprobs": true, "top_logprobs": 50}),
                "top_logprobs",
                "invalid option top_logprobs: must be an integer from 0 to 20, got 50",
            ),
            (json!({"top_logprobs": -1}), "top_logprobs", "invalid option top_logprobs: must be an integer from 0 to 20, got -1"),
            (
                json!({"max_completion_tokens": 0}),
                "max_completion_tokens",
                "invalid option max_completion_tokens: must be an integer of at least 1, got 0",
            ),
            (
                json!({"logprobs": "yes"}),
                "logprobs",
                "invalid option logprobs: must be true or false, or an integer from 0 to 20, got \"yes\"",
            ),
            (json!({"n": 2}), "n", "invalid option n: must be 1 (one choice per request), got 2"),
        ] {
            let e = chat(extra.clone()).map(|_| ()).expect_err("refused");
            assert_eq!((e.code, e.param.as_deref(), e.message.as_str()), ("invalid_option", Some(param), message), "{extra}");
        }
        let count = |extra: Value| chat(extra).map(|api| api.request.options.logprobs).expect("valid");
        assert_eq!(count(json!({"logprobs": true, "top_logprobs": 20})), 20);
        assert_eq!(count(json!({"logprobs": true, "top_logprobs": 0})), 1, "each step's token, with one alternative");
        assert_eq!(count(json!({"logprobs": 0, "top_logprobs": 3})), 0);
        assert_eq!(count(json!({"top_logprobs": 3})), 0, "top_logprobs alone asks for none");
        let text = parsed(Endpoint::Completions, json!({"prompt": "p", "logprobs": 21})).map(|_| ()).expect_err("21");
        assert_eq!(
            (text.param.as_deref(), text.message.as_str()),
            (Some("logprobs"), "invalid option logprobs: must be an integer from 0 to 20, got 21")
        );
    }

    #[test]
    fn a_whole_answer_is_one_completion() {
        let meta = ResponseMeta::new(Endpoint::Completions, 1, 0, "m");
        let mut answer = Answer::new(meta, false, false);
        assert!(answer.on_token(&TokenEvent { id: Some(7), text: "hi".into(), logprobs: None }).is_empty());
        let out = answer.on_done(&generation(), Some(true));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["object"], "text_completion");
        assert_eq!(out[0]["choices"][0]["text"], "hi!");
        assert_eq!(out[0]["usage"]["response_cache_hit"], true);
        assert_eq!(out[0]["kestrel"]["response_cache_hit"], true);
        assert!(out[0]["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
        // Without speculative decoding, no stats.
        assert_eq!(out[0]["kestrel"].get("speculative"), None);
    }

    /// `speculative: false` turns the engine's speculative decoding off for one request, through
    /// either endpoint; the stats of a request it served come back with Kestrel's details.
    #[test]
    fn speculative_is_a_request_option_and_its_stats_come_back() {
        let option = |endpoint, body| parsed(endpoint, body).map(|api| api.request.options.speculative);
        assert_eq!(option(Endpoint::Chat, json!({"messages": [{"role": "user", "content": "c"}]})).ok(), Some(true));
        assert_eq!(option(Endpoint::Chat, json!({"messages": [{"role": "user", "content": "c"}], "speculative": false})).ok(), Some(false));
        assert_eq!(option(Endpoint::Completions, json!({"prompt": "p", "speculative": false})).ok(), Some(false));
        let e = option(Endpoint::Completions, json!({"prompt": "p", "speculative": "no"})).expect_err("not a boolean");
        assert_eq!(e.code, "invalid_option");

        let stats = SpeculativeStats { drafted: 6, accepted: 4, verifications: 2 };
        let generation = Generation { speculative: Some(stats), ..generation() };
        let meta = ResponseMeta::new(Endpoint::Chat, 1, 0, "m");
        let whole = Answer::new(meta.clone(), false, false).on_done(&generation, None);
        assert_eq!(whole[0]["kestrel"]["speculative"], json!({"drafted": 6, "accepted": 4, "verifications": 2}));
        // A stream's last chunk with a choice carries them too.
        let streamed = Answer::new(meta, true, false).on_done(&generation, None);
        let last = streamed.iter().rev().find(|c| c.get("kestrel").is_some()).expect("the chunk with the details");
        assert_eq!(last["kestrel"]["speculative"]["accepted"], 4);
    }
}
