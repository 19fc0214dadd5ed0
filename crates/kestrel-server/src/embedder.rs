//! The embedding thread: owns an embedding model or a reranker (`kestrel_model::Embedder`) and
//! runs one request at a time, an embeddings or a rerank request (`Work`). Each call already
//! spreads over every core (the CPU backend's pool) or waits on the GPU, blocking this thread
//! (`pollster`) rather than the async runtime, where it would stall the other connections. Requests that arrive while
//! one runs wait in a bounded queue; past its bound they are refused at once (HTTP 429).
//!
//! A request whose client went away before its turn is skipped: its reply channel is closed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kestrel_engine::embeddings::{not_an_embedding_model, EmbeddingRequest};
use kestrel_engine::rerank::{not_a_reranker, RerankRequest};
use kestrel_engine::EngineError;
use kestrel_model::{Embedder, Embeddings, Ranking};
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::metrics::Metrics;

type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// A request the embedding thread runs: parsed by the engine core, run on the `Embedder`.
pub trait Work: Sized + Send + Sync + 'static {
    type Output: Send + 'static;
    /// Parses the request's body.
    fn parse_body(body: &[u8]) -> Result<Self, EngineError>;
    /// The request's error when the server holds a chat model (of architecture `arch`).
    fn not_for_chat(arch: &str) -> EngineError;
    fn run(&self, embedder: &Embedder) -> Result<Self::Output, EngineError>;
    /// The queued job that runs `request` and sends its answer to `reply`.
    fn job(request: Arc<Self>, reply: Reply<Self::Output>) -> Job;
}

impl Work for EmbeddingRequest {
    type Output = Embeddings;
    fn parse_body(body: &[u8]) -> Result<Self, EngineError> {
        Self::parse_body(body)
    }
    fn not_for_chat(arch: &str) -> EngineError {
        not_an_embedding_model(arch)
    }
    fn run(&self, embedder: &Embedder) -> Result<Embeddings, EngineError> {
        // This thread is the embedder's own: it waits for a GPU pass's readback.
        pollster::block_on(EmbeddingRequest::run(self, embedder))
    }
    fn job(request: Arc<Self>, reply: Reply<Embeddings>) -> Job {
        Job::Embed(request, reply)
    }
}

impl Work for RerankRequest {
    type Output = Ranking;
    fn parse_body(body: &[u8]) -> Result<Self, EngineError> {
        Self::parse_body(body)
    }
    fn not_for_chat(arch: &str) -> EngineError {
        not_a_reranker(arch)
    }
    fn run(&self, embedder: &Embedder) -> Result<Ranking, EngineError> {
        pollster::block_on(RerankRequest::run(self, embedder))
    }
    fn job(request: Arc<Self>, reply: Reply<Ranking>) -> Job {
        Job::Rerank(request, reply)
    }
}

pub enum Job {
    Embed(Arc<EmbeddingRequest>, Reply<Embeddings>),
    Rerank(Arc<RerankRequest>, Reply<Ranking>),
}

/// What the embedding thread and the handlers share.
struct Shared {
    /// Admitted requests not yet answered: the running one and the queued ones.
    pending: AtomicUsize,
    /// The most that may be pending: the running one and the queue.
    capacity: usize,
    /// Set by shutdown: queued requests are refused.
    stopping: AtomicBool,
    /// A running mean of request durations in milliseconds, for `Retry-After`.
    mean_duration_ms: AtomicU64,
}

pub struct EmbeddingWorker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    /// GGUF's name of the model's architecture (`bert`, `nomic-bert`), for error messages.
    arch: &'static str,
    /// "embedding" or "reranker" (`Embedder::kind`).
    kind: &'static str,
    /// Where the model's layers run, "gpu" or "cpu" (`Embedder::backend`).
    backend: &'static str,
}

impl EmbeddingWorker {
    /// Starts the embedding thread with `embedder`, admitting up to `queue` requests beyond the
    /// one it runs.
    pub fn start(embedder: Embedder, queue: usize, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let (arch, kind, backend) = (embedder.config().arch, embedder.kind(), embedder.backend());
        metrics.model_memory.set(embedder.weight_bytes() as u64);
        let (jobs, inbox) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            pending: AtomicUsize::new(0),
            capacity: queue + 1,
            stopping: AtomicBool::new(false),
            mean_duration_ms: AtomicU64::new(100),
        });
        let thread = {
            let shared = shared.clone();
            let metrics = metrics.clone();
            std::thread::Builder::new().name("kestrel-embed".into()).spawn(move || run(&embedder, &inbox, &shared, &metrics))?
        };
        Ok(Self { jobs: Some(jobs), thread: Some(thread), shared, metrics, arch, kind, backend })
    }

    /// Admits `request`; the receiver gets its answer (vectors, scores) or its error. Refused
    /// when the running request and the queue are taken, or once shutdown began.
    pub fn submit<W: Work>(&self, request: Arc<W>) -> Result<oneshot::Receiver<Result<W::Output, ApiError>>, ApiError> {
        if self.shared.stopping.load(Ordering::Relaxed) {
            return Err(ApiError::shutting_down());
        }
        let admitted =
            self.shared.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.shared.capacity).then_some(n + 1));
        if let Err(pending) = admitted {
            let wait_s = (pending as u64 * self.shared.mean_duration_ms.load(Ordering::Relaxed)).div_ceil(1000);
            return Err(ApiError::busy(wait_s.max(1)));
        }
        let (reply, answer) = oneshot::channel();
        self.metrics.queue_depth.inc();
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(W::job(request, reply)).is_ok());
        if !sent {
            self.metrics.queue_depth.dec();
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::shutting_down());
        }
        Ok(answer)
    }

    /// Stops admitting and refuses the queued requests; the running one finishes (a call cannot
    /// be interrupted, and it is short).
    pub fn abort_all(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    pub fn arch(&self) -> &'static str {
        self.arch
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Requests admitted and not answered.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Acquire)
    }

    /// Waits for the queued requests to end and the thread to exit, dropping the model.
    pub fn join(mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's loop: one request at a time until every handle to the worker is gone.
fn run(embedder: &Embedder, inbox: &mpsc::Receiver<Job>, shared: &Shared, metrics: &Metrics) {
    while let Ok(job) = inbox.recv() {
        metrics.queue_depth.dec();
        match job {
            Job::Embed(request, reply) => answer(embedder, &*request, reply, shared, metrics),
            Job::Rerank(request, reply) => answer(embedder, &*request, reply, shared, metrics),
        }
    }
}

/// Runs `request` and sends its answer, unless shutdown began (refused) or its client is gone
/// (skipped: nobody would read it).
fn answer<W: Work>(embedder: &Embedder, request: &W, reply: Reply<W::Output>, shared: &Shared, metrics: &Metrics) {
    let result = if shared.stopping.load(Ordering::Relaxed) {
        Err(ApiError::shutting_down())
    } else if reply.is_closed() {
        shared.pending.fetch_sub(1, Ordering::AcqRel);
        return;
    } else {
        metrics.slots_in_use.set(1);
        let started = Instant::now();
        let result = request.run(embedder).map_err(|e| ApiError::from(&e));
        metrics.slots_in_use.set(0);
        remember_duration(shared, started.elapsed());
        result
    };
    // Freed before the answer goes out, so a client that sends its next request as soon as it
    // has this one's answer finds the place free.
    shared.pending.fetch_sub(1, Ordering::AcqRel);
    let _ = reply.send(result);
}

/// Folds a request's duration into the running mean (weight 1/8 for the newest).
fn remember_duration(shared: &Shared, elapsed: Duration) {
    let ms = elapsed.as_millis().min(u128::from(u32::MAX)) as u64;
    let _ = shared.mean_duration_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| Some((mean * 7 + ms) / 8));
}
