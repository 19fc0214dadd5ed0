pub mod bench;
pub mod chat;
pub mod embed;
pub mod generate;
pub mod inspect;
mod load;
pub mod quantize;
pub mod serve;
pub mod split;
pub mod tokenize;

/// Errors of the CLI are shown to a person: a message is all they need.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// A model error as the CLI shows it: the message, then its stable code in brackets.
pub fn coded(e: kestrel_model::ModelError) -> String {
    format!("{e} [{}]", e.code())
}

/// An engine error as the CLI shows it, as `coded` shows a model error.
pub fn engine_coded(e: &kestrel_engine::EngineError) -> String {
    format!("{e} [{}]", e.code)
}
