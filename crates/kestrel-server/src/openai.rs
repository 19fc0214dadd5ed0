//! OpenAI's request and response shapes over Kestrel's own: the envelope fields of
//! `/v1/chat/completions` and `/v1/completions` (`model`, `stream`, `n`, `logprobs`, ...) are
//! taken here, and everything else is the generation request the browser engine also takes
//! (`kestrel_model::Request`: the same options, defaults and errors).

use kestrel_model::{ChatMessage, FinishReason, Generation, Request};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
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

/// Roles a chat template knows. OpenAI's `developer` is its newer name for `system`.
const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<ApiRequest, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid("invalid_json", format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(ApiError::invalid("invalid_json", "the body must be a JSON object"));
    };
    fields.retain(|_, v| !v.is_null());
    for name in IGNORED {
        fields.remove(name);
    }
    let stream = take_bool(&mut fields, "stream")?;
    let include_usage = match fields.remove("stream_options") {
        None => false,
        Some(Value::Object(mut options)) => take_bool(&mut options, "include_usage")?,
        Some(_) => return Err(ApiError::invalid("invalid_option", "stream_options must be an object").with_param("stream_options")),
    };
    match fields.remove("n") {
        None => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) => {
            return Err(ApiError::invalid("invalid_option", format!("n must be 1 (one choice per request), got {n}")).with_param("n"))
        }
    }
    if let Some(max) = fields.remove("max_completion_tokens") {
        fields.entry("max_tokens").or_insert(max);
    }
    match endpoint {
        Endpoint::Chat => {
            // Chat: `logprobs` is a flag and `top_logprobs` the count.
            let wanted = take_bool(&mut fields, "logprobs")?;
            let top = fields.remove("top_logprobs");
            if wanted {
                let top = top.as_ref().map_or(Some(1), Value::as_u64).ok_or_else(|| {
                    ApiError::invalid("invalid_option", "top_logprobs must be a non-negative integer").with_param("top_logprobs")
                })?;
                fields.insert("logprobs".into(), json!(top.max(1)));
            }
            let messages = fields
                .remove("messages")
                .ok_or_else(|| ApiError::invalid("invalid_option", "messages is required").with_param("messages"))?;
            if fields.contains_key("prompt") {
                return Err(
                    ApiError::invalid("invalid_option", "prompt is not a chat completions field; use /v1/completions").with_param("prompt")
                );
            }
            fields.insert("messages".into(), chat_messages(messages)?);
        }
        Endpoint::Completions => {
            // Completions: `logprobs` is the count already. A prompt may come as a list of one.
            let not_text = || ApiError::invalid("invalid_option", "prompt must be a string (or a list of one string)").with_param("prompt");
            let prompt = match fields.remove("prompt") {
                Some(Value::String(text)) => text,
                Some(Value::Array(list)) => match <[Value; 1]>::try_from(list) {
                    Ok([Value::String(text)]) => text,
                    _ => return Err(not_text()),
                },
                Some(_) => return Err(not_text()),
                None => return Err(ApiError::invalid("invalid_option", "prompt is required").with_param("prompt")),
            };
            if fields.contains_key("messages") {
                return Err(ApiError::invalid("invalid_option", "messages is not a completions field; use /v1/chat/completions")
                    .with_param("messages"));
            }
            fields.insert("prompt".into(), Value::String(prompt));
        }
    }
    let request = Request::from_value(Value::Object(fields)).map_err(|e| ApiError::from(&e))?;
    Ok(ApiRequest { request, stream, include_usage })
}

fn take_bool(fields: &mut Map<String, Value>, name: &'static str) -> Result<bool, ApiError> {
    match fields.remove(name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(b),
        Some(other) => Err(ApiError::invalid("invalid_option", format!("{name} must be a boolean, got {other}")).with_param(name)),
    }
}

/// OpenAI's messages as the chat template takes them: a known role and text content (a string,
/// or a list of text parts, which are joined).
fn chat_messages(messages: Value) -> Result<Value, ApiError> {
    let bad = |message: String| ApiError::invalid("invalid_option", message).with_param("messages");
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
            _ => return Err(bad(format!("messages[{i}].content must be a string or a list of text parts"))),
        };
        out.push(ChatMessage::new(role, content));
    }
    serde_json::to_value(out).map_err(|e| bad(e.to_string()))
}

/// What the responses of one request share.
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    pub fn new(endpoint: Endpoint, serial: u64, model: &str) -> Self {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self { endpoint, id: format!("{}-{created:x}{serial:04x}", endpoint.id_prefix()), created, model: model.to_string() }
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "system_fingerprint": null, "choices": choices })
    }

    /// A streamed chunk with text (`None`: the chat's first chunk, which gives the role).
    pub fn chunk(&self, text: Option<&str>, token_id: Option<u32>) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = match text {
                    None => json!({ "role": "assistant", "content": "" }),
                    Some(text) => json!({ "content": text }),
                };
                self.envelope(
                    "chat.completion.chunk",
                    json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null, "token_id": token_id }]),
                )
            }
            Endpoint::Completions => self.envelope(
                "text_completion",
                json!([{ "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": null, "token_id": token_id }]),
            ),
        }
    }

    /// The stream's last chunk with a choice: its finish reason, and Kestrel's details.
    pub fn final_chunk(&self, generation: &Generation, cache_hit: bool) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({ "index": 0, "delta": {}, "logprobs": null, "finish_reason": generation.finish_reason }),
            Endpoint::Completions => json!({ "index": 0, "text": "", "logprobs": null, "finish_reason": generation.finish_reason }),
        };
        let object = if self.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut chunk = self.envelope(object, json!([choice]));
        chunk["kestrel"] = details(generation, cache_hit);
        chunk
    }

    /// `stream_options.include_usage`'s chunk: no choices, the usage.
    pub fn usage_chunk(&self, generation: &Generation, cache_hit: bool) -> Value {
        let object = if self.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut chunk = self.envelope(object, json!([]));
        chunk["usage"] = usage(generation, cache_hit);
        chunk
    }

    /// The whole answer of a request that did not stream.
    pub fn completion(&self, generation: &Generation, cache_hit: bool) -> Value {
        let mut body = match self.endpoint {
            Endpoint::Chat => self.envelope(
                "chat.completion",
                json!([{ "index": 0, "message": { "role": "assistant", "content": generation.text }, "logprobs": null, "finish_reason": generation.finish_reason }]),
            ),
            Endpoint::Completions => self.envelope(
                "text_completion",
                json!([{ "index": 0, "text": generation.text, "logprobs": null, "finish_reason": generation.finish_reason }]),
            ),
        };
        body["usage"] = usage(generation, cache_hit);
        body["kestrel"] = details(generation, cache_hit);
        body
    }
}

/// OpenAI's usage, plus whether the exact-response cache answered (no model run).
fn usage(generation: &Generation, cache_hit: bool) -> Value {
    let prompt = generation.prompt_tokens.len();
    let completion = generation.tokens.len();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": generation.timings.reused_tokens },
        "response_cache_hit": cache_hit,
    })
}

/// What the npm package gives in its `kestrel` field: token ids, timings, log-probabilities.
fn details(generation: &Generation, cache_hit: bool) -> Value {
    json!({
        "prompt_token_ids": generation.prompt_tokens,
        "token_ids": generation.tokens,
        "timings": generation.timings,
        "logprobs": generation.logprobs,
        "response_cache_hit": cache_hit,
    })
}

/// Whether a result may be stored in the exact-response cache: a whole answer.
pub fn is_complete(generation: &Generation) -> bool {
    generation.finish_reason != FinishReason::Abort
}
