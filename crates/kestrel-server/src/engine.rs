//! The engine thread: owns the model and generates the admitted requests, streaming each token
//! to its request's channel. On the CPU backend it runs up to one request per KV slot as one
//! batch (`batching.rs`); on the GPU backend, one at a time. Requests that arrive while every
//! slot is busy wait in the queue; past the queue's bound they are refused at once (HTTP 429).
//!
//! A request is cancelled by dropping its [`Ticket`] (the client went away, or the HTTP handler
//! ended): generation stops at its next token (with batching: before the next step). Shutdown
//! aborts the running requests and refuses the queued ones.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kestrel_model::{BackendKind, Generation, Model, ModelError, Request, TokenEvent};
use tokio::sync::mpsc as async_mpsc;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a request hears from the engine, in order: tokens, then one `Done`.
pub enum Event {
    Token(TokenEvent),
    Done(Result<Generation, ApiError>),
}

pub(crate) struct Job {
    pub request: Request,
    pub events: async_mpsc::UnboundedSender<Event>,
    pub cancelled: Arc<AtomicBool>,
    pub arrived: Instant,
}

impl Job {
    /// Whether to stop generating for it: its client is gone, or the server is stopping.
    pub fn abandoned(&self, shared: &Shared) -> bool {
        self.cancelled.load(Ordering::Relaxed) || shared.stopping.load(Ordering::Relaxed)
    }
}

/// A request admitted to the engine: its events, and its cancellation when dropped.
pub struct Ticket {
    events: async_mpsc::UnboundedReceiver<Event>,
    cancelled: Arc<AtomicBool>,
}

impl Ticket {
    /// The next event; `None` only if the engine is gone.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

pub struct Engine {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    /// Where the model runs ("gpu" or "cpu").
    backend: &'static str,
}

/// What the engine thread and the handlers share.
pub(crate) struct Shared {
    /// Admitted requests not yet finished: the running one and the queued ones.
    pending: AtomicUsize,
    /// The most that may be pending: the slots and the queue.
    capacity: usize,
    /// Sequences generated at once.
    slots: usize,
    /// Set by shutdown: the running requests stop, queued ones are refused.
    pub stopping: AtomicBool,
    /// A running mean of request durations in milliseconds, for `Retry-After`.
    mean_duration_ms: AtomicU64,
}

impl Engine {
    /// Starts the engine thread with `model`, generating for as many requests at once as it has
    /// KV slots (`Model::set_slots`, batched) and admitting up to `queue` waiting requests.
    pub fn start(model: Model, queue: usize, prefill_chunk: usize, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let backend = model.backend();
        let slots = model.slots();
        let (jobs, inbox) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            pending: AtomicUsize::new(0),
            capacity: slots + queue,
            slots,
            stopping: AtomicBool::new(false),
            mean_duration_ms: AtomicU64::new(1000),
        });
        let thread = {
            let shared = shared.clone();
            let metrics = metrics.clone();
            // One GPU slot runs each request alone, its decode steps run ahead and sampled on the
            // device; otherwise requests run as batched sequences.
            let batched = backend == BackendKind::Cpu || slots > 1;
            std::thread::Builder::new().name("kestrel-engine".into()).spawn(move || {
                if batched {
                    crate::batching::run(model, &inbox, &shared, &metrics, prefill_chunk);
                } else {
                    run(model, &inbox, &shared, &metrics);
                }
            })?
        };
        let backend = backend.as_str();
        Ok(Self { jobs: Some(jobs), thread: Some(thread), shared, metrics, backend })
    }

    /// Admits `request`, or refuses it when every slot and the queue are taken.
    pub fn submit(&self, request: Request) -> Result<Ticket, ApiError> {
        if self.shared.stopping.load(Ordering::Relaxed) {
            return Err(ApiError::shutting_down());
        }
        let admitted =
            self.shared.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.shared.capacity).then_some(n + 1));
        if let Err(pending) = admitted {
            // Requests ahead of a new one, each taking about the mean duration.
            let mean_ms = self.shared.mean_duration_ms.load(Ordering::Relaxed);
            let wait_s = (pending as u64 * mean_ms / self.shared.slots as u64).div_ceil(1000);
            return Err(ApiError::busy(wait_s.max(1)));
        }
        let (events, receiver) = async_mpsc::unbounded_channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let job = Job { request, events, cancelled: cancelled.clone(), arrived: Instant::now() };
        self.metrics.queue_depth.inc();
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            self.metrics.queue_depth.dec();
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::shutting_down());
        }
        Ok(Ticket { events: receiver, cancelled })
    }

    /// Stops admitting; the running request ends at its next token and queued ones are refused.
    pub fn abort_all(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// Where the model runs: "gpu" or "cpu".
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Requests generated at once.
    pub fn slots(&self) -> usize {
        self.shared.slots
    }

    /// Requests admitted and not finished.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Acquire)
    }

    /// Waits for the queued requests to end and the engine thread to exit, dropping the model.
    pub fn join(mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One request at a time (the GPU backend with one KV slot), each decoded with its steps run
/// ahead.
fn run(mut model: Model, inbox: &mpsc::Receiver<Job>, shared: &Shared, metrics: &Metrics) {
    update_gauges(&model, metrics);
    while let Ok(job) = inbox.recv() {
        metrics.queue_depth.dec();
        let result = if job.cancelled.load(Ordering::Relaxed) {
            None
        } else if shared.stopping.load(Ordering::Relaxed) {
            Some(Err(ApiError::shutting_down()))
        } else {
            metrics.queue_wait.observe(job.arrived.elapsed().as_secs_f64());
            metrics.slots_in_use.set(1);
            let result = generate(&mut model, &job, shared, metrics);
            metrics.slots_in_use.set(0);
            Some(result)
        };
        finish(&job, result, shared, metrics);
        update_gauges(&model, metrics);
    }
}

/// A job's end: its result (None: its client is gone before it started), the metrics of a
/// finished generation, and its place among the pending requests freed.
pub(crate) fn finish(job: &Job, result: Option<Result<Generation, ApiError>>, shared: &Shared, metrics: &Metrics) {
    if let Some(result) = result {
        let elapsed = job.arrived.elapsed();
        if let Ok(generation) = &result {
            metrics.request_duration.observe(elapsed.as_secs_f64());
            metrics.prompt_tokens.inc_by(generation.prompt_tokens.len() as u64);
            metrics.generated_tokens.inc_by(generation.tokens.len() as u64);
            remember_duration(shared, elapsed);
        }
        let _ = job.events.send(Event::Done(result));
    }
    shared.pending.fetch_sub(1, Ordering::AcqRel);
}

/// Times a token of `job` whose previous one came at `last` (None: its first).
pub(crate) fn observe_token(job: &Job, last: &mut Option<Instant>, metrics: &Metrics) {
    let now = Instant::now();
    match *last {
        None => metrics.time_to_first_token.observe((now - job.arrived).as_secs_f64()),
        Some(last) => metrics.inter_token_latency.observe((now - last).as_secs_f64()),
    }
    *last = Some(now);
}

fn generate(model: &mut Model, job: &Job, shared: &Shared, metrics: &Metrics) -> Result<Generation, ApiError> {
    let as_api = |e: ModelError| ApiError::from(&e);
    let options = &job.request.options;
    // Every option and request limit before the prompt is encoded, as the browser engine does.
    options.validate(model.config().vocab).map_err(as_api)?;
    let tokens = model.encode(&job.request.prompt().map_err(as_api)?).map_err(as_api)?;
    let mut last_token: Option<Instant> = None;
    let mut on_token = |event: &TokenEvent| -> bool {
        if event.id.is_some() {
            observe_token(job, &mut last_token, metrics);
            metrics.batch_size.observe(1.0);
        }
        let delivered = job.events.send(Event::Token(event.clone())).is_ok();
        delivered && !job.abandoned(shared)
    };
    pollster::block_on(model.generate(&tokens, options, &mut on_token)).map_err(as_api)
}

pub(crate) fn update_gauges(model: &Model, metrics: &Metrics) {
    metrics.kv_cache_tokens.set(model.kv_cache_tokens() as i64);
    metrics.model_memory.set(model.weight_bytes() + model.kv_cache_bytes());
    if let Some(bytes) = model.gpu().and_then(|gpu| gpu.allocated_bytes()) {
        metrics.gpu_memory.set(bytes);
    }
}

/// Folds a request's duration into the running mean (weight 1/8 for the newest).
fn remember_duration(shared: &Shared, elapsed: Duration) {
    let ms = elapsed.as_millis().min(u128::from(u32::MAX)) as u64;
    let _ = shared.mean_duration_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| Some((mean * 7 + ms) / 8));
}
