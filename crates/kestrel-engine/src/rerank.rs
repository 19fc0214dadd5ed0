//! The rerank endpoint over a reranker (a cross-encoder `Embedder`, rank pooling), once for every
//! front end: the request of llama.cpp server's and Jina's / Cohere's `/v1/rerank`, its errors,
//! the call, and the answer's JSON.

use kestrel_model::encoder::MAX_INPUTS;
use kestrel_model::{Embedder, Ranking};
use serde_json::{json, Map, Value};

use crate::{body, EngineError};

/// A parsed rerank request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RerankRequest {
    /// The request's `model`, which the answer echoes as llama.cpp's server does.
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// How many of the best results the answer keeps; None: all.
    pub top_n: Option<usize>,
    /// Whether each result carries its document's text (`document: {text}`), as Cohere's and
    /// Jina's answers can; off by default, as Cohere's and llama.cpp's answers have none.
    pub return_documents: bool,
}

impl RerankRequest {
    /// Parses a body given as JSON bytes (a bad body is `invalid_json`).
    pub fn parse_body(body: &[u8]) -> Result<Self, EngineError> {
        Self::parse(body::json(body)?)
    }

    /// Parses the request: `query` (a string), `documents` (1 to `MAX_INPUTS` strings), `top_n`
    /// (a positive integer), `return_documents` (a boolean), `model` (a string). A field set to
    /// `null` is the same as an absent one; an unknown field is refused.
    pub fn parse(value: Value) -> Result<Self, EngineError> {
        let mut fields = body::fields(value)?;
        let model = match fields.remove("model") {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(v) => return Err(EngineError::invalid("model", format!("model must be a string, not {v}"))),
        };
        let query = match fields.remove("query") {
            Some(Value::String(s)) if !s.is_empty() => s,
            Some(v) => return Err(EngineError::invalid("query", format!("query must be a non-empty string, not {v}"))),
            None => return Err(EngineError::invalid("query", "query is required")),
        };
        let documents = match fields.remove("documents") {
            Some(Value::Array(items)) => parse_documents(items)?,
            Some(v) => return Err(EngineError::invalid("documents", format!("documents must be an array of strings, not {v}"))),
            None => return Err(EngineError::invalid("documents", "documents is required")),
        };
        let top_n = match fields.remove("top_n") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| EngineError::invalid("top_n", format!("top_n must be a positive integer, not {v}")))?,
            ),
        };
        let return_documents = match fields.remove("return_documents") {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(v) => return Err(EngineError::invalid("return_documents", format!("return_documents must be a boolean, not {v}"))),
        };
        refuse_unknown(fields)?;
        Ok(Self { model, query, documents, top_n, return_documents })
    }

    /// Scores the documents against the query on `reranker`.
    pub async fn run(&self, reranker: &Embedder) -> Result<Ranking, EngineError> {
        let documents: Vec<&str> = self.documents.iter().map(String::as_str).collect();
        Ok(reranker.rerank(&self.query, &documents).await?)
    }

    /// The answer: `{model, object: "list", results: [{index, relevance_score, document?:
    /// {text}}], usage: {prompt_tokens, total_tokens}}`, the results best first (ties keep the
    /// documents' order) and cut to `top_n`. `model` is the request's where it named one, else
    /// `model_name`.
    pub fn response(&self, model_name: &str, ranking: &Ranking) -> Value {
        let mut order: Vec<(usize, f32)> = ranking.scores.iter().copied().enumerate().collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        order.truncate(self.top_n.unwrap_or(order.len()));
        let results: Vec<Value> = order
            .into_iter()
            .map(|(index, score)| {
                let mut result = json!({ "index": index, "relevance_score": score });
                if let (true, Some(text), Value::Object(fields)) = (self.return_documents, self.documents.get(index), &mut result) {
                    fields.insert("document".into(), json!({ "text": text }));
                }
                result
            })
            .collect();
        json!({
            "model": self.model.as_deref().unwrap_or(model_name),
            "object": "list",
            "results": results,
            "usage": { "prompt_tokens": ranking.prompt_tokens, "total_tokens": ranking.prompt_tokens },
        })
    }
}

/// The error of a rerank request to a chat model.
pub fn not_a_reranker(arch: &str) -> EngineError {
    EngineError::invalid(
        "model",
        format!("this is a chat model ({arch}): it generates text, it cannot rerank documents (load a reranker: a bert GGUF with pooling_type 4)"),
    )
}

fn parse_documents(items: Vec<Value>) -> Result<Vec<String>, EngineError> {
    if items.is_empty() || items.len() > MAX_INPUTS {
        return Err(EngineError::invalid("documents", format!("{} documents: 1 to {MAX_INPUTS} per request", items.len())));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s),
            other => Err(EngineError::invalid("documents", format!("documents[{i}] must be a string, not {other}"))),
        })
        .collect()
}

fn refuse_unknown(fields: Map<String, Value>) -> Result<(), EngineError> {
    match fields.into_iter().map(|(k, _)| k).next() {
        Some(k) => Err(EngineError::invalid(k.clone(), format!("unknown field {k:?} in a rerank request"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(v: Value) -> RerankRequest {
        RerankRequest::parse(v).unwrap()
    }

    #[test]
    fn fields_are_checked() {
        let err = |v: Value| RerankRequest::parse(v).unwrap_err();
        let param = |v: Value| err(v).param;
        assert_eq!(param(json!({ "documents": ["a"] })).as_deref(), Some("query"));
        assert_eq!(param(json!({ "query": "", "documents": ["a"] })).as_deref(), Some("query"));
        assert_eq!(param(json!({ "query": 3, "documents": ["a"] })).as_deref(), Some("query"));
        assert_eq!(param(json!({ "query": "q" })).as_deref(), Some("documents"));
        for bad in [json!([]), json!("a"), json!([1]), json!([["a"]])] {
            assert_eq!(param(json!({ "query": "q", "documents": bad })).as_deref(), Some("documents"), "{bad}");
        }
        let many = vec!["a"; MAX_INPUTS + 1];
        assert_eq!(param(json!({ "query": "q", "documents": many })).as_deref(), Some("documents"));
        for bad in [json!(0), json!(-1), json!(1.5), json!("2")] {
            assert_eq!(param(json!({ "query": "q", "documents": ["a"], "top_n": bad })).as_deref(), Some("top_n"), "{bad}");
        }
        assert_eq!(param(json!({ "query": "q", "documents": ["a"], "return_documents": "yes" })).as_deref(), Some("return_documents"));
        assert_eq!(param(json!({ "query": "q", "documents": ["a"], "model": 1 })).as_deref(), Some("model"));
        assert_eq!(param(json!({ "query": "q", "documents": ["a"], "rank_fields": [] })).as_deref(), Some("rank_fields"));
        assert_eq!(err(json!(["q"])).code, "invalid_json");
        assert_eq!(RerankRequest::parse_body(b"{").unwrap_err().code, "invalid_json");
        assert_eq!(err(json!({})).code, "invalid_option");
        let ok = request(json!({ "query": "q", "documents": ["a", ""], "top_n": null, "model": null }));
        assert_eq!(
            ok,
            RerankRequest { model: None, query: "q".into(), documents: vec!["a".into(), "".into()], top_n: None, return_documents: false }
        );
    }

    #[test]
    fn results_are_best_first_and_cut_to_top_n() {
        let req = request(json!({ "query": "q", "documents": ["a", "b", "c", "d"], "top_n": 3, "return_documents": true }));
        let ranking = Ranking { scores: vec![0.25, 0.75, 0.25, 0.5], prompt_tokens: 20 };
        let answer = req.response("reranker", &ranking);
        assert_eq!(
            answer,
            json!({
                "model": "reranker",
                "object": "list",
                "results": [
                    { "index": 1, "relevance_score": 0.75, "document": { "text": "b" } },
                    { "index": 3, "relevance_score": 0.5, "document": { "text": "d" } },
                    { "index": 0, "relevance_score": 0.25, "document": { "text": "a" } },
                ],
                "usage": { "prompt_tokens": 20, "total_tokens": 20 },
            })
        );
    }

    #[test]
    fn a_chat_model_refuses_naming_the_model() {
        let err = not_a_reranker("llama");
        assert_eq!((err.code, err.param.as_deref()), ("invalid_option", Some("model")));
        assert!(err.message.contains("chat model (llama)") && err.message.contains("cannot rerank"), "{}", err.message);
    }

    #[test]
    fn documents_are_left_out_unless_asked_and_the_model_is_echoed() {
        let req = request(json!({ "model": "bge", "query": "q", "documents": ["a", "b"], "top_n": 10 }));
        let answer = req.response("reranker", &Ranking { scores: vec![0.1, 0.9], prompt_tokens: 7 });
        assert_eq!(answer["model"], "bge");
        let results = answer["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert!(results.iter().all(|r| r.get("document").is_none()));
    }
}
