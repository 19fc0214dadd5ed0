//! The embedding thread: owns an embedding model (`kestrel_model::Embedder`) and embeds one
//! request at a time. `Embedder::embed` is synchronous and already spreads each call over every
//! core (the CPU backend's pool), so requests run one after another on this thread rather than on
//! the async runtime, where they would stall the other connections. Requests that arrive while
//! one runs wait in a bounded queue; past its bound they are refused at once (HTTP 429).
//!
//! A request whose client went away before its turn is skipped: its reply channel is closed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kestrel_engine::embeddings::EmbeddingRequest;
use kestrel_model::{Embedder, Embeddings};
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::metrics::Metrics;

struct Job {
    request: Arc<EmbeddingRequest>,
    reply: oneshot::Sender<Result<Embeddings, ApiError>>,
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
}

impl EmbeddingWorker {
    /// Starts the embedding thread with `embedder`, admitting up to `queue` requests beyond the
    /// one it runs.
    pub fn start(embedder: Embedder, queue: usize, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let arch = embedder.config().arch;
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
        Ok(Self { jobs: Some(jobs), thread: Some(thread), shared, metrics, arch })
    }

    /// Admits `request`; the receiver gets its vectors or its error. Refused when the running
    /// request and the queue are taken, or once shutdown began.
    pub fn submit(&self, request: Arc<EmbeddingRequest>) -> Result<oneshot::Receiver<Result<Embeddings, ApiError>>, ApiError> {
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
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(Job { request, reply }).is_ok());
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
        let result = if shared.stopping.load(Ordering::Relaxed) {
            Err(ApiError::shutting_down())
        } else if job.reply.is_closed() {
            // Its client is gone: nobody would read the vectors.
            shared.pending.fetch_sub(1, Ordering::AcqRel);
            continue;
        } else {
            metrics.slots_in_use.set(1);
            let started = Instant::now();
            let result = job.request.run(embedder).map_err(|e| ApiError::from(&e));
            metrics.slots_in_use.set(0);
            remember_duration(shared, started.elapsed());
            result
        };
        // Freed before the answer goes out, so a client that sends its next request as soon as
        // it has this one's answer finds the place free.
        shared.pending.fetch_sub(1, Ordering::AcqRel);
        let _ = job.reply.send(result);
    }
}

/// Folds a request's duration into the running mean (weight 1/8 for the newest).
fn remember_duration(shared: &Shared, elapsed: Duration) {
    let ms = elapsed.as_millis().min(u128::from(u32::MAX)) as u64;
    let _ = shared.mean_duration_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| Some((mean * 7 + ms) / 8));
}
