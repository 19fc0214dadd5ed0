//! The server's Prometheus metrics (`GET /metrics`, OpenMetrics text through the
//! `prometheus-client` crate): requests by endpoint and outcome, latency histograms, tokens,
//! the inputs and tokens embedded, the documents and tokens reranked, the engine's occupancy and the GPU memory in use.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `chat_completions`, `completions`, `models`, ...
    pub endpoint: String,
    /// `ok`, `abort` or the error code.
    pub outcome: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub request_duration: Histogram,
    pub queue_wait: Histogram,
    pub prompt_tokens: Counter,
    pub generated_tokens: Counter,
    /// Sequences run together per step (decoding, or a prompt chunk).
    pub batch_size: Histogram,
    pub slots_in_use: Gauge,
    pub queue_depth: Gauge,
    /// Tokens whose keys and values the KV cache holds (the cached prefix).
    pub kv_cache_tokens: Gauge,
    pub gpu_memory: Gauge<u64, AtomicU64>,
    pub model_memory: Gauge<u64, AtomicU64>,
    pub response_cache_hits: Counter,
    pub response_cache_bytes: Gauge,
    /// Inputs (texts or token lists) of answered embeddings requests.
    pub embedding_inputs: Counter,
    /// Tokens of answered embeddings requests (their `usage.prompt_tokens`).
    pub embedding_tokens: Counter,
    pub embedding_duration: Histogram,
    /// Documents of answered rerank requests.
    pub rerank_documents: Counter,
    /// Tokens of answered rerank requests (their `usage.prompt_tokens`).
    pub rerank_tokens: Counter,
    pub rerank_duration: Histogram,
    /// Of a speculative request's drafted tokens, the share the model kept.
    pub speculative_acceptance: Histogram,
    /// A speculative request's tokens per model step that verified a draft.
    pub speculative_tokens_per_step: Histogram,
}

impl Metrics {
    pub fn new(slots: usize) -> Self {
        let mut registry = Registry::with_prefix("kestrel");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Requests by endpoint and outcome", requests.clone());
        // 1 ms to about 65 s: a first token on a CPU emulator takes seconds, on a GPU milliseconds.
        let latency = || Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let time_to_first_token = latency();
        registry.register_with_unit(
            "time_to_first_token",
            "From arrival to the first generated token",
            Unit::Seconds,
            time_to_first_token.clone(),
        );
        let inter_token_latency = latency();
        registry.register_with_unit(
            "inter_token_latency",
            "Between consecutive generated tokens of a request",
            Unit::Seconds,
            inter_token_latency.clone(),
        );
        let request_duration = latency();
        registry.register_with_unit("request_duration", "From arrival to the last token", Unit::Seconds, request_duration.clone());
        let queue_wait = latency();
        registry.register_with_unit("queue_wait", "From arrival to the start of generation", Unit::Seconds, queue_wait.clone());
        let prompt_tokens = Counter::default();
        registry.register("prompt_tokens", "Prompt tokens of finished requests", prompt_tokens.clone());
        let generated_tokens = Counter::default();
        registry.register("generated_tokens", "Generated tokens", generated_tokens.clone());
        let batch_size = Histogram::new((0..=slots.ilog2()).map(|p| f64::from(1u32 << p)));
        registry.register("batch_size", "Sequences run together per step", batch_size.clone());
        let slots_in_use = Gauge::default();
        registry.register("slots_in_use", "Requests generating now", slots_in_use.clone());
        let queue_depth = Gauge::default();
        registry.register("queue_depth", "Requests waiting for a slot", queue_depth.clone());
        let kv_cache_tokens = Gauge::default();
        registry.register("kv_cache_tokens", "Tokens held in the KV cache", kv_cache_tokens.clone());
        let gpu_memory = Gauge::<u64, AtomicU64>::default();
        registry.register_with_unit("gpu_memory", "GPU memory allocated by the engine", Unit::Bytes, gpu_memory.clone());
        let model_memory = Gauge::<u64, AtomicU64>::default();
        registry.register_with_unit(
            "model_memory",
            "Memory of the model's weights and KV cache, on the GPU or in RAM by backend",
            Unit::Bytes,
            model_memory.clone(),
        );
        let response_cache_hits = Counter::default();
        registry.register("response_cache_hits", "Requests answered from the exact-response cache", response_cache_hits.clone());
        let response_cache_bytes = Gauge::default();
        registry.register_with_unit("response_cache", "Size of the exact-response cache", Unit::Bytes, response_cache_bytes.clone());
        let embedding_inputs = Counter::default();
        registry.register("embedding_inputs", "Inputs of answered embeddings requests", embedding_inputs.clone());
        let embedding_tokens = Counter::default();
        registry.register("embedding_tokens", "Tokens of answered embeddings requests", embedding_tokens.clone());
        let embedding_duration = latency();
        registry.register_with_unit(
            "embedding_request_duration",
            "From arrival to the answer of an embeddings request",
            Unit::Seconds,
            embedding_duration.clone(),
        );
        let rerank_documents = Counter::default();
        registry.register("rerank_documents", "Documents of answered rerank requests", rerank_documents.clone());
        let rerank_tokens = Counter::default();
        registry.register("rerank_tokens", "Tokens of answered rerank requests", rerank_tokens.clone());
        let rerank_duration = latency();
        registry.register_with_unit(
            "rerank_request_duration",
            "From arrival to the answer of a rerank request",
            Unit::Seconds,
            rerank_duration.clone(),
        );
        let speculative_acceptance = Histogram::new((1..=10).map(|i| f64::from(i) / 10.0));
        registry.register(
            "speculative_acceptance",
            "Share of a speculative request's drafted tokens that the model kept",
            speculative_acceptance.clone(),
        );
        // 1 (every draft fell) to 17 (a whole draft of 16 tokens kept, and the model's own).
        let speculative_tokens_per_step = Histogram::new([1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 17.0]);
        registry.register(
            "speculative_tokens_per_step",
            "A speculative request's tokens per model step that verified a draft",
            speculative_tokens_per_step.clone(),
        );
        Self {
            registry,
            requests,
            time_to_first_token,
            inter_token_latency,
            request_duration,
            queue_wait,
            prompt_tokens,
            generated_tokens,
            batch_size,
            slots_in_use,
            queue_depth,
            kv_cache_tokens,
            gpu_memory,
            model_memory,
            response_cache_hits,
            response_cache_bytes,
            embedding_inputs,
            embedding_tokens,
            embedding_duration,
            rerank_documents,
            rerank_tokens,
            rerank_duration,
            speculative_acceptance,
            speculative_tokens_per_step,
        }
    }

    pub fn count_request(&self, endpoint: &str, outcome: &str) {
        self.requests.get_or_create(&RequestLabels { endpoint: endpoint.into(), outcome: outcome.into() }).inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}
