//! The engine's error: a stable code (the npm package's `KestrelError.code`, the server's
//! `error.code`), the precise message, and the request field at fault where there is one. Each
//! front end dresses it in its own form (a JavaScript `Error`, an HTTP status and OpenAI's JSON).

use kestrel_model::ModelError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl EngineError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), param: None }
    }

    /// A request field with a bad value.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: "invalid_option", message: message.into(), param: Some(param.into()) }
    }
}

impl From<&ModelError> for EngineError {
    fn from(e: &ModelError) -> Self {
        let param = match e {
            ModelError::InvalidOption { name, .. } => Some((*name).to_owned()),
            _ => None,
        };
        Self { code: e.code(), message: e.to_string(), param }
    }
}

impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        Self::from(&e)
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EngineError {}
