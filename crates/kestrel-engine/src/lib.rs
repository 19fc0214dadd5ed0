//! Kestrel's engine core, once for every front end: a request's life from its options to its last
//! token (`generation`: the one generation loop over every running sequence, sampling, stop
//! strings, constraints, tool calls), the generation request and its validation (`request`), the
//! scheduler of requests over a loaded model (`scheduler`: continuous batching, chunked prefill,
//! aborts, slots, prefix reuse), the OpenAI layer (`openai`: both endpoints'
//! requests, streamed chunks and whole answers, usage), the engine's options (`options`) and the
//! choice of backend (`backend`), the embeddings endpoint over an embedding model
//! (`embeddings`), and the rerank endpoint over a reranker (`rerank`).
//! `kestrel serve` is HTTP around it; the wasm engine exposes it to the browser package's worker.

pub mod backend;
mod body;
pub mod embeddings;
mod error;
pub mod generation;
pub mod openai;
mod options;
mod request;
pub mod rerank;
pub mod scheduler;

pub use backend::{choose_backend, BackendPreference, Placement, Platform};
pub use error::EngineError;
pub use generation::{FinishReason, GenerateOptions, Generation, Generator, Prompt, StepLogprobs, Timings, TokenEvent};
pub use options::{EngineOptions, EngineSettings, GpuFeatures, MAX_PREFILL_CHUNK};
pub use request::Request;
pub use scheduler::{Aborts, Event, RequestId, Scheduler, StepReport, DEFAULT_PREFILL_CHUNK};
