//! The request scheduler every front end drives: the server's engine thread and the browser's
//! worker. Requests are prepared when they are submitted (checked, rendered, encoded), wait in
//! order, and run in the one generation loop (`generation::Generator`): continuous batching.
//! Between steps it ends aborted requests and admits waiting ones into free KV slots (the slot
//! whose cached tokens share the longest prefix with the prompt); each step runs every admitted
//! request's next token plus prompt chunks of at most `prefill_chunk` tokens, as one pass of the
//! model. A request ends as soon as its own step says so, and its slot takes the next one before
//! the following step, so a long prompt or answer never holds the others back by more than a
//! step. A request running alone has its decode steps run ahead on the device; an abort takes
//! effect at its next token.
//!
//! The front end says what happens outside: it submits requests under its own ids, aborts them
//! (from any thread, through [`Aborts`]), and routes each request's events, in order: `Started`,
//! tokens, then one `Done`.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kestrel_model::{BackendKind, Model, ModelError};
use web_time::Instant;

use crate::generation::speculation::SpeculativeOptions;
use crate::generation::{FinishReason, GenerateOptions, Generation, Generator, SequenceEvent, SequenceId, Timings, TokenEvent};
use crate::{EngineError, Request};

/// A request's id, the front end's own (unique among the requests it submits).
pub type RequestId = u64;

/// Prompt tokens a batched step runs at most, over all prompts being admitted: what a new prompt
/// may add to the running requests' time between tokens.
pub const DEFAULT_PREFILL_CHUNK: usize = 32;

/// What happens to a request, in order: `Started` when it leaves the queue, its tokens (and the
/// flush of held-back text), then one `Done`.
#[derive(Debug)]
pub enum Event {
    Started,
    Token(TokenEvent),
    Done(Result<Generation, EngineError>),
}

/// The aborts the front end asks for, shared with the scheduler: they take effect before the next
/// step. An abort may come before its
/// request is submitted (the request then ends at once, with no token).
#[derive(Clone, Debug, Default)]
pub struct Aborts(Arc<Mutex<AbortSet>>);

#[derive(Debug, Default)]
struct AbortSet {
    ids: HashSet<RequestId>,
    /// Every request, now and later (a server shutting down).
    all: bool,
}

impl Aborts {
    pub fn abort(&self, id: RequestId) {
        self.lock().ids.insert(id);
    }

    /// Aborts every request, those submitted later too.
    pub fn abort_all(&self) {
        self.lock().all = true;
    }

    fn is_aborted(&self, id: RequestId) -> bool {
        let set = self.lock();
        set.all || set.ids.contains(&id)
    }

    fn forget(&self, id: RequestId) {
        self.lock().ids.remove(&id);
    }

    /// A panic elsewhere while the set was held leaves it usable: it is a set of ids.
    fn lock(&self) -> MutexGuard<'_, AbortSet> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one step ran, for the front end's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Sequences the step ran together (None: nothing ran).
    pub batch: Option<usize>,
}

struct Queued {
    id: RequestId,
    prompt: Vec<u32>,
    options: GenerateOptions,
    submitted: Instant,
}

struct Running {
    id: RequestId,
    sequence: SequenceId,
    submitted: Instant,
}

pub struct Scheduler {
    generator: Generator,
    prefill_chunk: usize,
    /// Whether requests share steps (the CPU backend, or several slots), which the browser's
    /// worker tells apart: one request at a time has the KV cache to itself between requests.
    batched: bool,
    waiting: VecDeque<Queued>,
    running: Vec<Running>,
    aborts: Aborts,
}

impl Scheduler {
    /// Schedules requests on `model` with its KV slots (`Model::set_slots`), prompts
    /// `prefill_chunk` tokens a step in all while others decode (as `EngineSettings` checked
    /// it: 1 to `MAX_PREFILL_CHUNK`).
    pub fn new(model: Model, prefill_chunk: usize) -> Self {
        let batched = model.backend() == BackendKind::Cpu || model.slots() > 1;
        Self {
            generator: Generator::new(model),
            prefill_chunk,
            batched,
            waiting: VecDeque::new(),
            running: Vec::new(),
            aborts: Aborts::default(),
        }
    }

    pub fn model(&self) -> &Model {
        self.generator.model()
    }

    /// The generation loop, for what it says of the running sequences (slots, KV cache).
    pub fn generator(&self) -> &Generator {
        &self.generator
    }

    /// Sets how the engine speculates (`Generator::set_speculation`), before any request runs.
    pub fn set_speculation(&mut self, options: SpeculativeOptions, draft: Option<Model>) -> Result<(), ModelError> {
        self.generator.set_speculation(options, draft)
    }

    /// The model for a change while no request runs (reset, a KV prefix restored for the next
    /// request): None while one runs. Waiting requests have not touched the KV cache yet.
    pub fn model_mut(&mut self) -> Option<&mut Model> {
        self.generator.model_mut()
    }

    pub fn into_model(self) -> Model {
        self.generator.into_model()
    }

    pub fn aborts(&self) -> Aborts {
        self.aborts.clone()
    }

    /// Whether requests share steps (see `batched`).
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Queues `request` under `id`, prepared now: every option and limit checked, the prompt
    /// rendered and encoded. A request that cannot run fails here and is not queued.
    pub fn submit(&mut self, id: RequestId, request: &Request) -> Result<(), EngineError> {
        let prompt = self.generator.prepare(&request.prompt()?, &request.options)?;
        self.waiting.push_back(Queued { id, prompt, options: request.options.clone(), submitted: Instant::now() });
        Ok(())
    }

    /// The prompt token ids of a queued request.
    pub fn prompt_tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.waiting.iter().find(|q| q.id == id).map(|q| &q.prompt[..])
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Requests waiting to start.
    pub fn queued(&self) -> usize {
        self.waiting.len()
    }

    /// Requests generating now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Takes the waiting requests out of the queue, oldest first (a server refusing them as it
    /// shuts down): they get no event.
    pub fn take_queued(&mut self) -> Vec<RequestId> {
        self.waiting.drain(..).map(|q| q.id).collect()
    }

    /// Drops the running requests, whose state a panic in a step left in doubt: their sequences
    /// end and free their KV slots. Returns their ids; they get no event.
    pub fn drop_running(&mut self) -> Vec<RequestId> {
        let running = std::mem::take(&mut self.running);
        for r in &running {
            self.aborts.forget(r.id);
            let _ = self.generator.abort_sequence(r.sequence);
        }
        running.into_iter().map(|r| r.id).collect()
    }

    /// Runs one step and gives each event to `sink` with its request's id. `sink` returning false
    /// for a token means its receiver is gone: the request is aborted.
    pub async fn step(&mut self, sink: &mut dyn FnMut(RequestId, Event) -> bool) -> StepReport {
        self.end_aborted(sink);
        self.admit(sink);
        self.step_running(sink).await
    }

    /// Ends the aborted requests: a waiting one with no token, a running one with its tokens so far.
    fn end_aborted(&mut self, sink: &mut dyn FnMut(RequestId, Event) -> bool) {
        let mut i = 0;
        while i < self.waiting.len() {
            if !self.aborts.is_aborted(self.waiting[i].id) {
                i += 1;
                continue;
            }
            if let Some(q) = self.waiting.remove(i) {
                let generation = aborted_before_start(q.prompt);
                self.finish(q.id, q.submitted, Ok(generation), sink);
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if !self.aborts.is_aborted(self.running[i].id) {
                i += 1;
                continue;
            }
            let r = self.running.remove(i);
            if let Some(generation) = self.generator.abort_sequence(r.sequence) {
                self.finish(r.id, r.submitted, Ok(generation), sink);
            }
        }
    }

    /// Moves waiting requests into free slots, oldest first.
    fn admit(&mut self, sink: &mut dyn FnMut(RequestId, Event) -> bool) {
        while self.generator.free_slots() > 0 {
            let Some(q) = self.waiting.pop_front() else { return };
            match self.generator.add_sequence(&q.prompt, &q.options) {
                Ok(sequence) => {
                    sink(q.id, Event::Started);
                    self.running.push(Running { id: q.id, sequence, submitted: q.submitted });
                }
                Err(e) => self.finish(q.id, q.submitted, Err(e.into()), sink),
            }
        }
    }

    async fn step_running(&mut self, sink: &mut dyn FnMut(RequestId, Event) -> bool) -> StepReport {
        if self.running.is_empty() {
            return StepReport::default();
        }
        let step = self.generator.step(self.prefill_chunk).await;
        for (sequence, event) in step.events {
            let Some(i) = self.running.iter().position(|r| r.sequence == sequence) else { continue };
            match event {
                SequenceEvent::Token(token) => {
                    let id = self.running[i].id;
                    if !sink(id, Event::Token(token)) {
                        self.aborts.abort(id);
                    }
                }
                SequenceEvent::Done(result) => {
                    let r = self.running.remove(i);
                    self.finish(r.id, r.submitted, result.map_err(EngineError::from), sink);
                }
            }
        }
        StepReport { batch: (step.sequences > 0).then_some(step.sequences) }
    }

    /// A request's end: its end-to-end time in its timings, its abort forgotten.
    fn finish(
        &self,
        id: RequestId,
        submitted: Instant,
        result: Result<Generation, EngineError>,
        sink: &mut dyn FnMut(RequestId, Event) -> bool,
    ) {
        self.aborts.forget(id);
        let result = result.map(|mut generation| {
            generation.timings.e2e_ms = submitted.elapsed().as_secs_f64() * 1e3;
            generation
        });
        sink(id, Event::Done(result));
    }
}

/// The generation of a request aborted before it started: its prompt, no token.
fn aborted_before_start(prompt: Vec<u32>) -> Generation {
    let timings = Timings { prompt_tokens: prompt.len(), prefill_tokens: prompt.len(), ..Timings::default() };
    Generation {
        prompt_tokens: prompt,
        tokens: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Abort,
        timings,
        logprobs: Vec::new(),
        tool_calls: Vec::new(),
        speculative: None,
    }
}
