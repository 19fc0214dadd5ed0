//! Kestrel's tokenizer: built straight from a GGUF file's own vocabulary (no
//! `tokenizer.json` needed), matching llama.cpp's tokenization, plus streaming
//! detokenization and chat-template rendering.
//!
//! * [`Tokenizer`]: encode / decode, built from GGUF metadata
//!   ([`Tokenizer::from_gguf`]) or from a Hugging Face `tokenizer.json`
//!   ([`Tokenizer::from_json`]).
//! * [`StreamDecoder`]: turns generated ids into text one token at a time without
//!   ever emitting a broken UTF-8 character.
//! * [`ChatTemplate`]: renders OpenAI-style [`ChatMessage`]s with the model's Jinja
//!   chat template (minijinja, with Python string methods such as `.strip()`).
//!
//! Nothing here panics on outside data: every failure is a [`TokenizerError`].

mod chat;
mod error;
mod gguf;
mod pre;
mod special;
mod stream;
mod tokenizer;
mod unicode;
mod vocab;
mod wpm;

pub use chat::{python_json, ChatFunctionCall, ChatMessage, ChatTemplate, ChatToolCall, CHATML_TEMPLATE};
pub use error::{Result, TokenizerError};
pub use pre::{pre_tokenizer_regexes, PreTokenizerKind};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use vocab::{SpecialTokenIds, TokenType, Vocabulary, VocabularyModel};
