//! The engine thread: owns the model inside the engine core's scheduler (`kestrel_engine::
//! Scheduler`: batched on the CPU backend or with several KV slots, else one request at a time)
//! and routes each request's events to its channel, timing them for the metrics. Requests that
//! arrive while every slot is busy wait in the scheduler's queue; past the queue's bound they are
//! refused at once (HTTP 429).
//!
//! A request is cancelled by dropping its [`Ticket`] (the client went away, or the HTTP handler
//! ended): the scheduler aborts it before its next step or at its next token. Shutdown aborts
//! the running requests and refuses the queued ones.
//!
//! A panic in the engine (a bug; the server is built with `panic = "unwind"`) is caught at the
//! request boundary: the requests it was running end with a 500 (`internal`, with the panic's
//! message), their KV slots are freed, and the thread goes on serving the next ones.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use kestrel_engine::generation::speculation::SpeculativeOptions;
use kestrel_engine::{Aborts, Event as EngineEvent, Generation, Generator, Request, RequestId, Scheduler, TokenEvent};
use kestrel_model::Model;
use tokio::sync::mpsc as async_mpsc;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a request hears from the engine, in order: tokens, then one `Done`.
pub enum Event {
    Token(TokenEvent),
    Done(Result<Generation, ApiError>),
}

struct Job {
    id: RequestId,
    request: Request,
    events: async_mpsc::UnboundedSender<Event>,
    arrived: Instant,
}

/// A request the engine thread holds: where its events go, and its times for the metrics.
struct Route {
    events: async_mpsc::UnboundedSender<Event>,
    arrived: Instant,
    started: bool,
    last_token: Option<Instant>,
    /// The test build's hook: the engine panics at this request's first token (see [`PANIC_PROMPT`]).
    #[cfg(feature = "test-hooks")]
    panics: bool,
}

/// The prompt at whose first token the engine thread panics, in a build with the `test-hooks`
/// feature (the dev-profile CLI the tests run; never a release build): how the tests reach the
/// panic recovery, which no real request should.
#[cfg(feature = "test-hooks")]
pub const PANIC_PROMPT: &str = "kestrel test hook: panic in the engine thread";

/// A request admitted to the engine: its events, and its cancellation when dropped.
pub struct Ticket {
    id: RequestId,
    events: async_mpsc::UnboundedReceiver<Event>,
    aborts: Aborts,
    /// Its `Done` has come: nothing is left to abort.
    ended: bool,
}

impl Ticket {
    /// The next event; `None` only if the engine is gone.
    pub async fn next(&mut self) -> Option<Event> {
        let event = self.events.recv().await;
        self.ended |= matches!(event, Some(Event::Done(_)) | None);
        event
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.ended {
            self.aborts.abort(self.id);
        }
    }
}

pub struct Engine {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    aborts: Aborts,
    metrics: Arc<Metrics>,
    /// Where the model runs ("gpu" or "cpu").
    backend: &'static str,
    /// GGUF's name of the model's architecture, for error messages.
    arch: String,
    next_id: AtomicU64,
}

/// What the engine thread and the handlers share.
struct Shared {
    /// Admitted requests not yet finished: the running ones and the queued ones.
    pending: AtomicUsize,
    /// The most that may be pending: the slots and the queue.
    capacity: usize,
    /// Sequences generated at once.
    slots: usize,
    /// Set by shutdown: the running requests stop, queued ones are refused.
    stopping: AtomicBool,
    /// A running mean of request durations in milliseconds, for `Retry-After`.
    mean_duration_ms: AtomicU64,
}

/// A chat engine's speculative decoding: its options, and its draft model where it has one.
pub type Speculation = (SpeculativeOptions, Option<Model>);

impl Engine {
    /// Starts the engine thread with `model`, generating for as many requests at once as it has
    /// KV slots (`Model::set_slots`) and admitting up to `queue` waiting requests; a batched step
    /// prompts at most `prefill_chunk` tokens in all.
    pub fn start(
        model: Model,
        queue: usize,
        prefill_chunk: usize,
        speculation: Option<Speculation>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let backend = model.backend().as_str();
        // `Arch`'s variants are GGUF's architecture names in camel case (SmolLm3: smollm3).
        let arch = format!("{:?}", model.config().arch).to_lowercase();
        let slots = model.slots();
        let mut scheduler = Scheduler::new(model, prefill_chunk);
        if let Some((options, draft)) = speculation {
            scheduler.set_speculation(options, draft).map_err(|e| std::io::Error::other(format!("{}: {e}", e.code())))?;
        }
        let aborts = scheduler.aborts();
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
            std::thread::Builder::new().name("kestrel-engine".into()).spawn(move || run(scheduler, &inbox, &shared, &metrics))?
        };
        Ok(Self { jobs: Some(jobs), thread: Some(thread), shared, aborts, metrics, backend, arch, next_id: AtomicU64::new(0) })
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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.metrics.queue_depth.inc();
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(Job { id, request, events, arrived: Instant::now() }).is_ok());
        if !sent {
            self.metrics.queue_depth.dec();
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::shutting_down());
        }
        Ok(Ticket { id, events: receiver, aborts: self.aborts.clone(), ended: false })
    }

    /// Stops admitting; running requests end at their next step or token, queued ones are refused.
    pub fn abort_all(&self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.aborts.abort_all();
    }

    /// Where the model runs: "gpu" or "cpu".
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    pub fn arch(&self) -> &str {
        &self.arch
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

/// The engine thread's loop: takes new requests in, steps the scheduler while it has work, and
/// sleeps until a request comes when it has none (or every handle to the engine is gone).
fn run(mut scheduler: Scheduler, inbox: &mpsc::Receiver<Job>, shared: &Shared, metrics: &Metrics) {
    let mut routes: HashMap<RequestId, Route> = HashMap::new();
    let mut open = true;
    update_gauges(scheduler.generator(), metrics);
    while open || !scheduler.is_idle() {
        if scheduler.is_idle() {
            match inbox.recv() {
                Ok(job) => take_guarded(&mut scheduler, job, &mut routes, shared, metrics),
                Err(_) => break,
            }
        }
        loop {
            match inbox.try_recv() {
                Ok(job) => take_guarded(&mut scheduler, job, &mut routes, shared, metrics),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if shared.stopping.load(Ordering::Relaxed) {
            for id in scheduler.take_queued() {
                if let Some(route) = routes.remove(&id) {
                    metrics.queue_depth.dec();
                    finish(&route, Err(ApiError::shutting_down()), shared, metrics);
                }
            }
        }
        let batched = scheduler.is_batched();
        // A request's end is delivered after the step's metrics are set: its client, once answered,
        // may read /metrics at once and must find there the step that answered it.
        let mut ended = Vec::new();
        let step = catch_unwind(AssertUnwindSafe(|| {
            pollster::block_on(scheduler.step(&mut |id, event| match event {
                EngineEvent::Done(result) => {
                    ended.push((id, result));
                    true
                }
                event => route_event(&mut routes, id, event, batched, shared, metrics),
            }))
        }));
        match step {
            Ok(report) => {
                if let Some(sequences) = report.batch {
                    metrics.batch_size.observe(sequences as f64);
                }
            }
            Err(payload) => fail_running(&mut scheduler, &mut routes, &panic_error(payload.as_ref()), shared, metrics),
        }
        metrics.slots_in_use.set(scheduler.running() as i64);
        update_gauges(scheduler.generator(), metrics);
        for (id, result) in ended {
            route_event(&mut routes, id, EngineEvent::Done(result), batched, shared, metrics);
        }
    }
}

/// [`take`], with a panic in it (rendering or encoding the prompt) ending that request alone.
fn take_guarded(scheduler: &mut Scheduler, job: Job, routes: &mut HashMap<RequestId, Route>, shared: &Shared, metrics: &Metrics) {
    let id = job.id;
    // The route goes into `routes` before the work that may panic, so the panic's error reaches it.
    let taken = catch_unwind(AssertUnwindSafe(|| take(scheduler, job, routes, shared, metrics)));
    if let Err(payload) = taken {
        if let Some(route) = routes.remove(&id) {
            metrics.queue_depth.dec();
            finish(&route, Err(panic_error(payload.as_ref())), shared, metrics);
        }
    }
}

/// After a panic in a step: every request not waiting in the queue was running in it, and ends
/// with `error`; the scheduler drops their sequences, whose state the panic left in doubt.
fn fail_running(scheduler: &mut Scheduler, routes: &mut HashMap<RequestId, Route>, error: &ApiError, shared: &Shared, metrics: &Metrics) {
    // Dropping the sequences runs model code too: a second panic there leaves them as they are.
    let _ = catch_unwind(AssertUnwindSafe(|| scheduler.drop_running()));
    let running: Vec<RequestId> = routes.keys().copied().filter(|&id| scheduler.prompt_tokens(id).is_none()).collect();
    for id in running {
        if let Some(route) = routes.remove(&id) {
            if !route.started {
                metrics.queue_depth.dec();
            }
            finish(&route, Err(error.clone()), shared, metrics);
        }
    }
    metrics.slots_in_use.set(scheduler.running() as i64);
}

/// The error a request gets when the engine panicked while serving it: a 500 with the panic's
/// message (the panic itself is also on the server's stderr, from the default hook).
fn panic_error(payload: &(dyn std::any::Any + Send)) -> ApiError {
    let what = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "internal",
        format!("the engine failed on this request: {}", what.unwrap_or("a panic without a message")),
    )
}

/// Submits a job's request to the scheduler; one that cannot run ends here with its error.
fn take(scheduler: &mut Scheduler, job: Job, routes: &mut HashMap<RequestId, Route>, shared: &Shared, metrics: &Metrics) {
    let route = Route {
        events: job.events,
        arrived: job.arrived,
        started: false,
        last_token: None,
        #[cfg(feature = "test-hooks")]
        panics: job.request.prompt.as_deref() == Some(PANIC_PROMPT),
    };
    if shared.stopping.load(Ordering::Relaxed) {
        metrics.queue_depth.dec();
        return finish(&route, Err(ApiError::shutting_down()), shared, metrics);
    }
    routes.insert(job.id, route);
    if let Err(e) = scheduler.submit(job.id, &job.request) {
        if let Some(route) = routes.remove(&job.id) {
            metrics.queue_depth.dec();
            finish(&route, Err(ApiError::from(&e)), shared, metrics);
        }
    }
}

/// Delivers one scheduler event to its request's channel, with its metrics. False when the
/// receiver is gone (the scheduler then aborts the request).
fn route_event(
    routes: &mut HashMap<RequestId, Route>,
    id: RequestId,
    event: EngineEvent,
    batched: bool,
    shared: &Shared,
    metrics: &Metrics,
) -> bool {
    match event {
        EngineEvent::Started => {
            if let Some(route) = routes.get_mut(&id) {
                route.started = true;
                metrics.queue_depth.dec();
                metrics.queue_wait.observe(route.arrived.elapsed().as_secs_f64());
                if !batched {
                    metrics.slots_in_use.set(1);
                }
            }
            true
        }
        EngineEvent::Token(token) => {
            let Some(route) = routes.get_mut(&id) else { return false };
            #[cfg(feature = "test-hooks")]
            if route.panics {
                panic!("the test hook's panic at the first token");
            }
            if token.id.is_some() {
                observe_token(route, metrics);
                if !batched {
                    metrics.batch_size.observe(1.0);
                }
            }
            route.events.send(Event::Token(token)).is_ok()
        }
        EngineEvent::Done(result) => {
            if let Some(route) = routes.remove(&id) {
                if !route.started {
                    metrics.queue_depth.dec();
                }
                finish(&route, result.map_err(|e| ApiError::from(&e)), shared, metrics);
            }
            true
        }
    }
}

/// A request's end: its result, the metrics of a generation that ran, and its place among the
/// pending requests freed.
fn finish(route: &Route, result: Result<Generation, ApiError>, shared: &Shared, metrics: &Metrics) {
    let elapsed = route.arrived.elapsed();
    if let (Ok(generation), true) = (&result, route.started) {
        metrics.request_duration.observe(elapsed.as_secs_f64());
        metrics.prompt_tokens.inc_by(generation.prompt_tokens.len() as u64);
        metrics.generated_tokens.inc_by(generation.tokens.len() as u64);
        if let Some(stats) = generation.speculative.filter(|s| s.drafted > 0) {
            metrics.speculative_acceptance.observe(stats.accepted as f64 / stats.drafted as f64);
            metrics.speculative_tokens_per_step.observe(stats.tokens_per_step());
        }
        remember_duration(shared, elapsed);
    }
    let _ = route.events.send(Event::Done(result));
    shared.pending.fetch_sub(1, Ordering::AcqRel);
}

/// Times a token: the first after the request arrived, the others after the one before.
fn observe_token(route: &mut Route, metrics: &Metrics) {
    let now = Instant::now();
    match route.last_token {
        None => metrics.time_to_first_token.observe((now - route.arrived).as_secs_f64()),
        Some(last) => metrics.inter_token_latency.observe((now - last).as_secs_f64()),
    }
    route.last_token = Some(now);
}

fn update_gauges(generator: &Generator, metrics: &Metrics) {
    let model = generator.model();
    metrics.kv_cache_tokens.set(generator.kv_cache_tokens() as i64);
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
