//! A JSON request body's first checks, once for every endpoint (chat and text completions,
//! embeddings, rerank): it parses, it is an object, and a field set to `null` is an absent one.

use serde_json::{Map, Value};

use crate::EngineError;

/// The body's JSON value (a bad body is `invalid_json`).
pub(crate) fn json(body: &[u8]) -> Result<Value, EngineError> {
    serde_json::from_slice(body).map_err(|e| EngineError::new("invalid_json", format!("the body is not valid JSON: {e}")))
}

/// The request's fields, without those set to `null` (a body that is not an object is
/// `invalid_json`).
pub(crate) fn fields(value: Value) -> Result<Map<String, Value>, EngineError> {
    let Value::Object(mut fields) = value else {
        return Err(EngineError::new("invalid_json", "the body must be a JSON object"));
    };
    fields.retain(|_, v| !v.is_null());
    Ok(fields)
}
