pub mod inspect;
pub mod quantize;
pub mod tokenize;

/// Errors of the CLI are shown to a person: a message is all they need.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;
