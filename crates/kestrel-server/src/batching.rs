//! The engine's scheduler on the CPU backend: continuous batching. Between steps it admits
//! queued requests into free KV slots and ends those whose client went away; each step runs
//! every admitted request's next token, plus prompt chunks of at most `prefill_chunk` tokens,
//! as one pass of the model (`Model::step_sequences`). A request ends as soon as its own step
//! says so, and its slot takes the next queued request before the following step, so a long
//! prompt or a long answer never holds the others back by more than a step.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use kestrel_model::{Model, SequenceEvent, SequenceId};

use crate::engine::{finish, observe_token, update_gauges, Event, Job, Shared};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// A request generating in a slot.
struct Running {
    job: Job,
    last_token: Option<Instant>,
}

pub(crate) fn run(mut model: Model, inbox: &mpsc::Receiver<Job>, shared: &Shared, metrics: &Metrics, prefill_chunk: usize) {
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut running: HashMap<SequenceId, Running> = HashMap::new();
    let mut open = true;
    update_gauges(&model, metrics);
    while open || !waiting.is_empty() || !running.is_empty() {
        // Idle: sleep until a request comes (or every handle to the engine is gone).
        if running.is_empty() && waiting.is_empty() {
            match inbox.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => break,
            }
        }
        loop {
            match inbox.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        admit(&mut model, &mut waiting, &mut running, shared, metrics);
        let abandoned: Vec<SequenceId> = running.iter().filter(|(_, r)| r.job.abandoned(shared)).map(|(&id, _)| id).collect();
        for id in abandoned {
            if let (Some(r), Some(generation)) = (running.remove(&id), model.abort_sequence(id)) {
                finish(&r.job, Some(Ok(generation)), shared, metrics);
            }
        }
        metrics.slots_in_use.set(running.len() as i64);
        if running.is_empty() {
            update_gauges(&model, metrics);
            continue;
        }
        let step = pollster::block_on(model.step_sequences(prefill_chunk));
        metrics.batch_size.observe(step.sequences as f64);
        for (id, event) in step.events {
            let Some(r) = running.get_mut(&id) else { continue };
            match event {
                SequenceEvent::Token(token) => {
                    if token.id.is_some() {
                        observe_token(&r.job, &mut r.last_token, metrics);
                    }
                    if r.job.events.send(Event::Token(token)).is_err() {
                        // The receiver is gone: aborted before the next step.
                        r.job.cancelled.store(true, Ordering::Relaxed);
                    }
                }
                SequenceEvent::Done(result) => {
                    if let Some(r) = running.remove(&id) {
                        finish(&r.job, Some(result.map_err(|e| ApiError::from(&e))), shared, metrics);
                    }
                }
            }
        }
        metrics.slots_in_use.set(running.len() as i64);
        update_gauges(&model, metrics);
    }
}

/// Moves queued requests into free slots, oldest first: a request whose client is gone is
/// dropped, one that fails before generating (bad options, a prompt over the context) ends
/// with its error, and during shutdown every queued one is refused.
fn admit(model: &mut Model, waiting: &mut VecDeque<Job>, running: &mut HashMap<SequenceId, Running>, shared: &Shared, metrics: &Metrics) {
    while model.free_slots() > 0 || shared.stopping.load(Ordering::Relaxed) {
        let Some(job) = waiting.pop_front() else { return };
        metrics.queue_depth.dec();
        if job.cancelled.load(Ordering::Relaxed) {
            finish(&job, None, shared, metrics);
            continue;
        }
        if shared.stopping.load(Ordering::Relaxed) {
            finish(&job, Some(Err(ApiError::shutting_down())), shared, metrics);
            continue;
        }
        metrics.queue_wait.observe(job.arrived.elapsed().as_secs_f64());
        // Every option and request limit before the prompt is encoded, as the browser engine does.
        let added = (job.request.options.validate(model.config().vocab))
            .and_then(|()| job.request.prompt())
            .and_then(|prompt| model.encode(&prompt))
            .and_then(|tokens| model.add_sequence(&tokens, &job.request.options));
        match added {
            Ok(id) => {
                running.insert(id, Running { job, last_token: None });
            }
            Err(e) => finish(&job, Some(Err(ApiError::from(&e))), shared, metrics),
        }
    }
}
