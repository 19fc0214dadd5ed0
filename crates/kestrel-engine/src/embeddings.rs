//! OpenAI's embeddings endpoint over an `Embedder`, once for every front end (the npm package's
//! `embeddings.create`, `kestrel serve`'s `/v1/embeddings`, `kestrel embed`): the request's
//! fields and their errors, the call, and the answer's JSON.

use base64::Engine as _;
use kestrel_model::{EmbedInput, EmbedOptions, Embedder, Embeddings};
use serde_json::{json, Map, Value};

use crate::{body, EngineError};

/// How the vectors are written in the answer (`encoding_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// JSON arrays of numbers.
    Float,
    /// Each vector's little-endian f32 bytes in base64, as OpenAI's clients decode them.
    Base64,
}

/// One input as the request gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// A parsed embeddings request.
#[derive(Clone, Debug)]
pub struct EmbeddingRequest {
    pub inputs: Vec<Input>,
    pub dimensions: Option<usize>,
    pub encoding: Encoding,
    /// Kestrel's own: an input past the model's context is cut to it rather than refused.
    pub truncate: bool,
}

/// Fields OpenAI's embeddings request has that change nothing here: accepted and dropped.
const IGNORED: [&str; 2] = ["model", "user"];

impl EmbeddingRequest {
    /// Parses a body given as JSON bytes (a bad body is `invalid_json`).
    pub fn parse_body(body: &[u8]) -> Result<Self, EngineError> {
        Self::parse(body::json(body)?)
    }

    /// Parses the request: `input` (a string, an array of strings, an array of token ids, or an
    /// array of such arrays), `dimensions`, `encoding_format`, `truncate`. A field set to `null`
    /// is the same as an absent one; an unknown field is refused.
    pub fn parse(value: Value) -> Result<Self, EngineError> {
        let mut fields = body::fields(value)?;
        let input = fields.remove("input").ok_or_else(|| EngineError::invalid("input", "input is required"))?;
        let inputs = parse_inputs(input)?;
        let dimensions = match fields.remove("dimensions") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .filter(|&d| d > 0)
                    .ok_or_else(|| EngineError::invalid("dimensions", format!("dimensions must be a positive integer, not {v}")))?,
            ),
        };
        let encoding = match fields.remove("encoding_format") {
            None => Encoding::Float,
            Some(Value::String(s)) if s == "float" => Encoding::Float,
            Some(Value::String(s)) if s == "base64" => Encoding::Base64,
            Some(v) => {
                return Err(EngineError::invalid("encoding_format", format!("encoding_format must be \"float\" or \"base64\", not {v}")))
            }
        };
        let truncate = match fields.remove("truncate") {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(v) => return Err(EngineError::invalid("truncate", format!("truncate must be a boolean, not {v}"))),
        };
        refuse_unknown(fields)?;
        Ok(Self { inputs, dimensions, encoding, truncate })
    }

    /// Embeds the inputs on `embedder` (async: a GPU pass awaits its readback).
    pub async fn run(&self, embedder: &Embedder) -> Result<Embeddings, EngineError> {
        let inputs: Vec<EmbedInput<'_>> = self
            .inputs
            .iter()
            .map(|i| match i {
                Input::Text(t) => EmbedInput::Text(t),
                Input::Tokens(t) => EmbedInput::Tokens(t),
            })
            .collect();
        let options = EmbedOptions { dimensions: self.dimensions, normalize: true, truncate: self.truncate };
        Ok(embedder.embed(&inputs, &options).await?)
    }

    /// OpenAI's answer: `{object: "list", data: [{object: "embedding", index, embedding}], model,
    /// usage: {prompt_tokens, total_tokens}}`.
    pub fn response(&self, model: &str, embeddings: &Embeddings) -> Value {
        let data: Vec<Value> = embeddings
            .vectors
            .iter()
            .enumerate()
            .map(|(index, v)| {
                let embedding = match self.encoding {
                    Encoding::Float => json!(v),
                    Encoding::Base64 => {
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                };
                json!({ "object": "embedding", "index": index, "embedding": embedding })
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": { "prompt_tokens": embeddings.prompt_tokens, "total_tokens": embeddings.prompt_tokens },
        })
    }
}

/// The error of an embeddings request to a chat model.
pub fn not_an_embedding_model(arch: &str) -> EngineError {
    EngineError::invalid(
        "model",
        format!("this is a chat model ({arch}): it generates text, it cannot embed it (load an embedding model such as a bert GGUF)"),
    )
}

fn parse_inputs(input: Value) -> Result<Vec<Input>, EngineError> {
    let bad = |what: String| EngineError::invalid("input", what);
    match input {
        Value::String(s) => Ok(vec![Input::Text(s)]),
        Value::Array(items) if items.is_empty() => Err(bad("input is an empty array".into())),
        // One input of token ids.
        Value::Array(items) if items.iter().all(Value::is_number) => Ok(vec![Input::Tokens(token_ids(&items)?)]),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(Input::Text(s)),
                Value::Array(ids) => token_ids(&ids).map(Input::Tokens),
                other => Err(bad(format!("input[{i}] must be a string or an array of token ids, not {other}"))),
            })
            .collect(),
        other => Err(bad(format!("input must be a string or an array, not {other}"))),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, EngineError> {
    items
        .iter()
        .map(|v| {
            v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| EngineError::invalid("input", format!("{v} is not a token id")))
        })
        .collect()
}

fn refuse_unknown(fields: Map<String, Value>) -> Result<(), EngineError> {
    match fields.into_iter().map(|(k, _)| k).find(|k| !IGNORED.contains(&k.as_str())) {
        Some(k) => Err(EngineError::invalid(k.clone(), format!("unknown field {k:?} in an embeddings request"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_shape_openai_takes() {
        let parse = |v: Value| EmbeddingRequest::parse(json!({ "input": v })).map(|r| r.inputs);
        assert_eq!(parse(json!("a")).unwrap(), vec![Input::Text("a".into())]);
        assert_eq!(parse(json!(["a", "b"])).unwrap(), vec![Input::Text("a".into()), Input::Text("b".into())]);
        assert_eq!(parse(json!([1, 2])).unwrap(), vec![Input::Tokens(vec![1, 2])]);
        assert_eq!(parse(json!([[1], [2, 3]])).unwrap(), vec![Input::Tokens(vec![1]), Input::Tokens(vec![2, 3])]);
        for bad in [json!([]), json!(5), json!([{}]), json!([-1]), json!([[1.5]]), json!(true)] {
            assert_eq!(parse(bad.clone()).unwrap_err().param.as_deref(), Some("input"), "{bad}");
        }
    }

    #[test]
    fn fields_are_checked() {
        let err = |v: Value| EmbeddingRequest::parse(v).unwrap_err();
        assert_eq!(err(json!({})).param.as_deref(), Some("input"));
        assert_eq!(err(json!({ "input": "a", "dimensions": 0 })).param.as_deref(), Some("dimensions"));
        assert_eq!(err(json!({ "input": "a", "encoding_format": "int8" })).param.as_deref(), Some("encoding_format"));
        assert_eq!(err(json!({ "input": "a", "truncate": "yes" })).param.as_deref(), Some("truncate"));
        assert_eq!(err(json!({ "input": "a", "temperature": 1 })).param.as_deref(), Some("temperature"));
        assert_eq!(err(json!([1])).code, "invalid_json");
        let ok =
            EmbeddingRequest::parse(json!({ "input": "a", "model": "m", "user": "u", "dimensions": null, "encoding_format": "base64" }))
                .unwrap();
        assert_eq!((ok.encoding, ok.dimensions, ok.truncate), (Encoding::Base64, None, false));
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        let req = EmbeddingRequest::parse(json!({ "input": "a", "encoding_format": "base64" })).unwrap();
        let answer = req.response("m", &Embeddings { vectors: vec![vec![1.0, -2.5]], prompt_tokens: 3 });
        let text = answer["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        let floats: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(floats, vec![1.0, -2.5]);
        assert_eq!(answer["usage"], json!({ "prompt_tokens": 3, "total_tokens": 3 }));
        assert_eq!((answer["object"].as_str(), answer["data"][0]["object"].as_str()), (Some("list"), Some("embedding")));
    }
}
