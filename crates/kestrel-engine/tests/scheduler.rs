//! The engine core's scheduler on the default model: requests run batched (the CPU backend, and
//! the GPU with several slots) or one at a time (the GPU with one slot), each giving the tokens it
//! gives alone; aborts at every stage; bad requests refused at submission; events in order.

use std::collections::HashMap;
use std::path::PathBuf;

use kestrel_engine::{Event, Request, RequestId, Scheduler};
use kestrel_engine::{FinishReason, Generation, Generator};
use kestrel_gpu::{Gpu, GpuOptions};
use kestrel_model::{LoadOptions, Model};

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh", path.display());
    path
}

fn cpu_model(slots: usize) -> Model {
    let options = LoadOptions { context_length: Some(256), ..LoadOptions::default() };
    let mut model = pollster::block_on(kestrel_model::load_file_cpu(&model_path(), options, &mut |_| {})).expect("load on the CPU");
    model.set_slots(slots).expect("slots");
    model
}

fn gpu_model(slots: usize) -> Model {
    let gpu = Gpu::new_blocking(&GpuOptions::default()).expect("a GPU adapter (lavapipe)");
    let options = LoadOptions { context_length: Some(256), slots, ..LoadOptions::default() };
    pollster::block_on(kestrel_model::load_file(&gpu, &model_path(), options, &mut |_| {})).expect("load on the GPU")
}

fn request(prompt: &str, max_tokens: usize) -> Request {
    Request::parse(&format!(r#"{{"prompt": {prompt:?}, "max_tokens": {max_tokens}, "temperature": 0, "ignore_eos": true}}"#))
        .expect("a valid request")
}

/// What a request heard, in order.
#[derive(Default, Debug)]
struct Heard {
    started: usize,
    /// Token events before `Started` or after `Done`, or a second `Done`: each a defect.
    out_of_order: usize,
    text: String,
    tokens: Vec<u32>,
    done: Option<Result<Generation, String>>,
}

/// Steps `scheduler` until it is idle, calling `between` before each step; returns what each
/// request heard, and the order in which requests started.
fn run(scheduler: &mut Scheduler, mut between: impl FnMut(&mut Scheduler, usize)) -> (HashMap<RequestId, Heard>, Vec<RequestId>) {
    let mut heard: HashMap<RequestId, Heard> = HashMap::new();
    let mut starts = Vec::new();
    let mut steps = 0;
    while !scheduler.is_idle() {
        between(scheduler, steps);
        steps += 1;
        assert!(steps < 10_000, "the scheduler never went idle");
        pollster::block_on(scheduler.step(&mut |id, event| {
            let h = heard.entry(id).or_default();
            match event {
                Event::Started => {
                    h.out_of_order += usize::from(h.started > 0 || h.done.is_some());
                    h.started += 1;
                    starts.push(id);
                }
                Event::Token(t) => {
                    h.out_of_order += usize::from(h.started == 0 || h.done.is_some());
                    h.text.push_str(&t.text);
                    h.tokens.extend(t.id);
                }
                Event::Done(result) => {
                    h.out_of_order += usize::from(h.done.is_some());
                    h.done = Some(result.map_err(|e| e.code.to_owned()));
                }
            }
            true
        }));
    }
    (heard, starts)
}

fn generation(h: &Heard) -> &Generation {
    match &h.done {
        Some(Ok(g)) => g,
        other => panic!("no generation: {other:?}"),
    }
}

/// Each request's tokens alone, through `Generator::generate`.
fn alone(model: &mut Generator, requests: &[Request]) -> Vec<Vec<u32>> {
    requests
        .iter()
        .map(|r| {
            let prompt = model.prepare(&r.prompt().expect("prompt"), &r.options).expect("prepare");
            pollster::block_on(model.generate(&prompt, &r.options, &mut |_| true)).expect("generate").tokens
        })
        .collect()
}

#[test]
fn batched_requests_give_their_tokens_alone_and_wait_for_a_slot() {
    let requests = [request("The kestrel", 7), request("Once upon a time", 12), request("1, 2, 3,", 5)];
    let expected = alone(&mut Generator::new(cpu_model(1)), &requests);
    let mut scheduler = Scheduler::new(cpu_model(2), 4);
    assert!(scheduler.is_batched());
    for (id, r) in requests.iter().enumerate() {
        scheduler.submit(id as RequestId, r).expect("submit");
    }
    assert_eq!(scheduler.queued(), 3);
    let (heard, starts) = run(&mut scheduler, |_, _| {});
    for (id, want) in expected.iter().enumerate() {
        let h = &heard[&(id as RequestId)];
        assert_eq!((h.started, h.out_of_order), (1, 0), "request {id}: {h:?}");
        let g = generation(h);
        assert_eq!(&g.tokens, want, "request {id}: batched tokens differ from alone");
        assert_eq!(&h.tokens, want, "request {id}: streamed tokens differ from the result's");
        assert_eq!(h.text, g.text);
        assert_eq!(g.finish_reason, FinishReason::Length);
        assert!(g.timings.e2e_ms >= g.timings.ttft_ms && g.timings.e2e_ms > 0.0, "{:?}", g.timings);
    }
    // Two slots: the third starts only when one of the first two has ended.
    assert_eq!(starts, [0, 1, 2]);
    assert_eq!(scheduler.generator().free_slots(), 2);
}

#[test]
fn aborts_end_requests_at_every_stage() {
    let mut scheduler = Scheduler::new(cpu_model(1), 32);
    let aborts = scheduler.aborts();
    // Aborted before it was submitted (a signal aborted before the call).
    aborts.abort(10);
    scheduler.submit(10, &request("a", 20)).expect("submit");
    // Running, aborted after its third token; and one waiting behind it, aborted there.
    scheduler.submit(11, &request("The kestrel", 50)).expect("submit");
    scheduler.submit(12, &request("b", 20)).expect("submit");
    let (heard, _) = run(&mut scheduler, |s, _| {
        // Between steps: once request 11 has run a few steps.
        if s.running() == 1 && s.queued() == 1 {
            aborts.abort(12);
        }
    });
    let before = generation(&heard[&10]);
    assert_eq!((before.finish_reason, before.tokens.len(), heard[&10].started), (FinishReason::Abort, 0, 0));
    assert_eq!(before.prompt_tokens.len(), before.timings.prompt_tokens);
    let queued = generation(&heard[&12]);
    assert_eq!((queued.finish_reason, queued.tokens.len()), (FinishReason::Abort, 0));
    assert_eq!(generation(&heard[&11]).finish_reason, FinishReason::Length);

    // A receiver gone (the sink says so) aborts the request before the next step.
    scheduler.submit(13, &request("The kestrel", 50)).expect("submit");
    let mut tokens = 0;
    let mut end = None;
    while !scheduler.is_idle() {
        pollster::block_on(scheduler.step(&mut |_, event| match event {
            Event::Token(_) => {
                tokens += 1;
                tokens < 3
            }
            Event::Done(result) => {
                end = Some(result.expect("ends"));
                true
            }
            Event::Started => true,
        }));
    }
    let end = end.expect("a Done");
    assert_eq!((end.finish_reason, end.tokens.len()), (FinishReason::Abort, 3));
}

#[test]
fn requests_that_cannot_run_are_refused_at_submission() {
    let mut scheduler = Scheduler::new(cpu_model(1), 32);
    let bad = Request::parse(r#"{"prompt": "x", "top_p": 2}"#).expect("parses");
    let e = scheduler.submit(0, &bad).expect_err("top_p 2");
    assert_eq!((e.code, e.param.as_deref()), ("invalid_option", Some("top_p")));
    let long = Request::parse(&format!(r#"{{"prompt": {:?}}}"#, "word ".repeat(400))).expect("parses");
    assert_eq!(scheduler.submit(1, &long).expect_err("over the context").code, "context_overflow");
    let neither = Request::parse("{}").expect("parses");
    assert_eq!(scheduler.submit(2, &neither).expect_err("no prompt").code, "invalid_option");
    assert!(scheduler.is_idle(), "nothing refused was queued");
}

#[test]
fn one_gpu_slot_runs_requests_alone_and_aborts_at_the_next_token() {
    let requests = [request("The kestrel", 6), request("Once upon a time", 4)];
    let mut model = Generator::new(gpu_model(1));
    let expected = alone(&mut model, &requests);
    let mut scheduler = Scheduler::new(model.into_model(), 32);
    assert!(!scheduler.is_batched());
    for (id, r) in requests.iter().enumerate() {
        scheduler.submit(id as RequestId, r).expect("submit");
    }
    let (heard, starts) = run(&mut scheduler, |_, _| {});
    assert_eq!(starts, [0, 1]);
    for (id, want) in expected.iter().enumerate() {
        let h = &heard[&(id as RequestId)];
        assert_eq!(h.out_of_order, 0);
        assert_eq!(&generation(h).tokens, want, "request {id}");
    }
    // Aborted from the token callback's side, as the worker's abort message does mid-generation:
    // the request ends at its next step, with the tokens it streamed (its steps run ahead on the
    // device are dropped).
    let aborts = scheduler.aborts();
    scheduler.submit(7, &request("The kestrel", 60)).expect("submit");
    let mut tokens = 0;
    let mut end = None;
    while end.is_none() {
        pollster::block_on(scheduler.step(&mut |_, event| {
            match event {
                Event::Token(_) => {
                    tokens += 1;
                    if tokens == 2 {
                        aborts.abort(7);
                    }
                }
                Event::Done(result) => end = Some(result.expect("ends")),
                Event::Started => {}
            }
            true
        }));
    }
    let end = end.expect("the request ended");
    assert_eq!(end.finish_reason, FinishReason::Abort);
    assert_eq!(end.tokens.len(), 2, "stopped at the token after the abort");
}
