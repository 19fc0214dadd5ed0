//! Soak: many requests from two clients at once against one engine, with random prompts, options,
//! lengths and stop strings, about a third aborted by their client at a random moment. None may
//! be lost or stuck, every text must be its tokens' decode, the KV prefix bookkeeping must stay
//! consistent (a request afterwards equals the same request on a fresh model) and memory flat.
//!
//! `KESTREL_SOAK_REQUESTS` sets the number of requests (default 30, CI's smoke); `./build.sh
//! soak` runs 1,000. `KESTREL_SOAK_SEED` replays a run (each run prints its seed).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kestrel_engine::generation::{FinishReason, GenerateOptions, Generation, Generator, Prompt};
use kestrel_model::ChatMessage;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A request taking longer than this is stuck: the longest one here (a prompt of ~150 tokens and
/// 48 generated on a tiny model) takes well under a second.
const STUCK_AFTER: Duration = Duration::from_secs(120);
const CONTEXT: usize = 512;
const CLIENTS: usize = 2;
const STOPS: [&str; 6] = ["\n", ".", "e", " the", "ing", "<|im_end|>"];
const WORDS: [&str; 12] = ["river", "stone", "the", "quiet", "engine", "learns", "blue", "ninety", "é", "日本", "🦀", "and"];

enum PromptSpec {
    Text(String),
    Chat(Vec<ChatMessage>),
}

struct Job {
    prompt: PromptSpec,
    options: GenerateOptions,
    abort: Arc<AtomicBool>,
    reply: mpsc::Sender<Result<Outcome, String>>,
}

/// What the engine saw of one request.
struct Outcome {
    generation: Generation,
    /// The streamed pieces, joined.
    streamed: String,
    /// The tokenizer's decode of the generated tokens.
    decoded: String,
}

fn words(rng: &mut StdRng, n: usize) -> String {
    (0..n).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
}

fn random_prompt(rng: &mut StdRng) -> PromptSpec {
    if rng.random_bool(0.3) {
        let n = rng.random_range(1..40);
        return PromptSpec::Text(words(rng, n));
    }
    // Chats share their system message, so the cached prefix is reused across requests.
    let mut messages = vec![ChatMessage::new("system", "You are a terse assistant.")];
    for turn in 0..rng.random_range(1..4) {
        let n = rng.random_range(1..20);
        messages.push(ChatMessage::new(if turn % 2 == 0 { "user" } else { "assistant" }, words(rng, n)));
    }
    if messages.last().is_some_and(|m| m.role == "assistant") {
        messages.push(ChatMessage::new("user", "and?"));
    }
    PromptSpec::Chat(messages)
}

fn random_options(rng: &mut StdRng) -> GenerateOptions {
    let pick = |rng: &mut StdRng, values: &[f32]| values[rng.random_range(0..values.len())];
    let n_stops = rng.random_range(0..3);
    GenerateOptions {
        max_tokens: rng.random_range(1..48),
        temperature: pick(rng, &[0.0, 0.7, 1.2]),
        top_k: [0, 40][rng.random_range(0..2)],
        top_p: pick(rng, &[1.0, 0.9]),
        min_p: pick(rng, &[0.0, 0.05]),
        repetition_penalty: pick(rng, &[1.0, 1.1]),
        frequency_penalty: pick(rng, &[0.0, 0.5]),
        presence_penalty: pick(rng, &[0.0, 0.5]),
        seed: Some(rng.random()),
        stop: (0..n_stops).map(|_| STOPS[rng.random_range(0..STOPS.len())].to_string()).collect(),
        ignore_eos: rng.random_bool(0.5),
        logprobs: if rng.random_bool(0.1) { 3 } else { 0 },
        ..GenerateOptions::default()
    }
}

fn run(model: &mut Generator, prompt: &PromptSpec, options: &GenerateOptions, abort: &AtomicBool) -> Result<Outcome, String> {
    let tokens = match prompt {
        PromptSpec::Text(text) => model.encode(&Prompt::Text(text)),
        PromptSpec::Chat(messages) => model.encode(&Prompt::Chat(messages)),
    }
    .map_err(|e| format!("encode: {e}"))?;
    let mut streamed = String::new();
    let generation = pollster::block_on(model.generate(&tokens, options, &mut |event| {
        streamed.push_str(&event.text);
        !abort.load(Ordering::Relaxed)
    }))
    .map_err(|e| format!("generate [{}]: {e}", e.code()))?;
    let decoded = model.model().tokenizer().decode(&generation.tokens).map_err(|e| format!("decode: {e}"))?;
    Ok(Outcome { generation, streamed, decoded })
}

/// Checks one request's outcome; returns what is wrong with it.
fn check(outcome: &Outcome, options: &GenerateOptions, aborted: bool) -> Result<(), String> {
    let g = &outcome.generation;
    if outcome.streamed != g.text {
        return Err(format!("streamed {:?} but returned {:?}", outcome.streamed, g.text));
    }
    if g.tokens.len() > options.max_tokens {
        return Err(format!("{} tokens for max_tokens {}", g.tokens.len(), options.max_tokens));
    }
    if g.finish_reason == FinishReason::Abort && !aborted {
        return Err("finished as aborted without an abort".into());
    }
    if let Some(stop) = options.stop.iter().find(|s| g.text.contains(s.as_str())) {
        return Err(format!("the stop string {stop:?} leaked into {:?}", g.text));
    }
    if g.text == outcome.decoded {
        return Ok(());
    }
    // A stop string cut the text: what follows it in the decode starts with that stop string.
    let rest = outcome.decoded.strip_prefix(g.text.as_str());
    if g.finish_reason == FinishReason::Stop && rest.is_some_and(|r| options.stop.iter().any(|s| r.starts_with(s.as_str()))) {
        return Ok(());
    }
    Err(format!("text {:?} is not the decode {:?} of its tokens", g.text, outcome.decoded))
}

#[derive(Default)]
struct Tally {
    done: usize,
    aborted: usize,
    stopped_by_string: usize,
    reused_tokens: usize,
    generated_tokens: usize,
    /// Time from sending each request to its answer, summed.
    busy: Duration,
    failures: Vec<String>,
}

#[test]
fn soak_two_clients_with_aborts_loses_nothing() {
    let requests: usize = std::env::var("KESTREL_SOAK_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let seed: u64 = std::env::var("KESTREL_SOAK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    println!("soak: {requests} requests, seed {seed} (KESTREL_SOAK_SEED={seed} replays it)");
    let path = common::synthetic::QWEN3_F32.write();
    let gpu = common::gpu();
    let mut model = Generator::new(common::load_on(&gpu, &path, CONTEXT));

    // The engine: one thread owning the model, serving jobs in arrival order (as the browser
    // worker and a server's scheduler do); it hands the model back when the clients are done.
    let (jobs, queue) = mpsc::channel::<Job>();
    let engine = std::thread::spawn(move || {
        for job in queue {
            let result = run(&mut model, &job.prompt, &job.options, &job.abort);
            // A client that gave up no longer listens; the engine goes on.
            let _ = job.reply.send(result);
        }
        model
    });

    let warm_up = (requests / 10).max(1);
    let memory_at_warm_up = Arc::new(std::sync::Mutex::new(None));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let jobs = jobs.clone();
            let gpu = gpu.clone();
            let memory_at_warm_up = memory_at_warm_up.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut tally = Tally::default();
                for i in (client..requests).step_by(CLIENTS) {
                    if i == warm_up {
                        *memory_at_warm_up.lock().expect("memory slot") = Some((common::resident_bytes(), common::settled_gpu_bytes(&gpu)));
                    }
                    let (prompt, options) = (random_prompt(&mut rng), random_options(&mut rng));
                    let abort_after = rng.random_bool(1.0 / 3.0).then(|| Duration::from_millis(rng.random_range(0..60)));
                    let abort = Arc::new(AtomicBool::new(false));
                    let (reply, answer) = mpsc::channel();
                    let start = Instant::now();
                    jobs.send(Job { prompt, options: options.clone(), abort: abort.clone(), reply }).expect("the engine is running");
                    if let Some(delay) = abort_after {
                        std::thread::sleep(delay);
                        abort.store(true, Ordering::Relaxed);
                    }
                    let outcome = match answer.recv_timeout(STUCK_AFTER.saturating_sub(start.elapsed())) {
                        Ok(Ok(outcome)) => outcome,
                        Ok(Err(e)) => {
                            tally.failures.push(format!("request {i}: {e}"));
                            continue;
                        }
                        Err(e) => {
                            tally.failures.push(format!("request {i}: no answer within {STUCK_AFTER:?} ({e})"));
                            break;
                        }
                    };
                    if let Err(e) = check(&outcome, &options, abort_after.is_some()) {
                        tally.failures.push(format!("request {i} ({options:?}): {e}"));
                    }
                    let g = &outcome.generation;
                    tally.done += 1;
                    tally.aborted += usize::from(g.finish_reason == FinishReason::Abort);
                    tally.stopped_by_string += usize::from(g.text != outcome.decoded);
                    tally.reused_tokens += g.timings.reused_tokens;
                    tally.generated_tokens += g.tokens.len();
                    tally.busy += start.elapsed();
                }
                tally
            })
        })
        .collect();
    drop(jobs);
    let tallies: Vec<Tally> = clients.into_iter().map(|c| c.join().expect("a client panicked")).collect();
    let mut model = engine.join().expect("the engine panicked");

    let total = |f: fn(&Tally) -> usize| tallies.iter().map(f).sum::<usize>();
    let failures: Vec<&String> = tallies.iter().flat_map(|t| &t.failures).collect();
    println!(
        "soak: {} of {requests} requests answered, {} aborted, {} cut by a stop string, {} tokens generated, {} prompt tokens reused",
        total(|t| t.done),
        total(|t| t.aborted),
        total(|t| t.stopped_by_string),
        total(|t| t.generated_tokens),
        total(|t| t.reused_tokens)
    );
    let busy: Duration = tallies.iter().map(|t| t.busy).sum();
    println!("soak: {:.0} ms from request to answer on average (two waiting at once)", busy.as_secs_f64() * 1e3 / requests.max(1) as f64);
    assert!(failures.is_empty(), "{} of {requests} requests failed (seed {seed}):\n{failures:#?}", failures.len());
    assert_eq!(total(|t| t.done), requests, "requests lost");
    assert!(total(|t| t.reused_tokens) > 0, "no request reused a cached prefix: the bookkeeping went untested");

    // Memory: flat from the end of the warm-up to the end of the soak.
    let (rss_warm, gpu_warm) = memory_at_warm_up.lock().expect("memory slot").expect("measured at warm-up");
    let (rss_end, gpu_end) = (common::resident_bytes(), common::settled_gpu_bytes(&gpu));
    println!(
        "soak: process memory {} MiB after warm-up, {} MiB at the end; GPU memory {gpu_warm} B, then {gpu_end} B",
        rss_warm >> 20,
        rss_end >> 20
    );
    // Every buffer of a request is allocated at load; the only allocations that come and go are
    // wgpu's staging buffers for queue writes (a few KiB each, a handful in flight).
    assert!(gpu_end <= gpu_warm + (64 << 10), "GPU memory grew from {gpu_warm} to {gpu_end} bytes during the soak");
    // The host allocator keeps some freed memory; 16 MiB is 17 KiB a request over a 1,000-request
    // soak, so a leak of any request's state (its prompt, tokens, text) would show.
    assert!(rss_end <= rss_warm + (16 << 20), "process memory grew from {rss_warm} to {rss_end} bytes during the soak");

    // The cached prefix after all that gives what a fresh model gives: a first request (whatever
    // it reuses of the soak's last prompt), then a second that reuses the first's system prompt.
    // The fresh model runs them in the other order, so each is compared with a run that reused
    // something else.
    let first = [ChatMessage::new("system", "You are a terse assistant."), ChatMessage::new("user", "river")];
    let second = [ChatMessage::new("system", "You are a terse assistant."), ChatMessage::new("user", "river stone")];
    let options = GenerateOptions { max_tokens: 24, ignore_eos: true, ..GenerateOptions::greedy() };
    let never = AtomicBool::new(false);
    let answer = |model: &mut Generator, chat: &[ChatMessage]| {
        run(model, &PromptSpec::Chat(chat.to_vec()), &options, &never).expect("a request after the soak").generation
    };
    let (soaked_first, soaked_second) = (answer(&mut model, &first), answer(&mut model, &second));
    assert!(soaked_second.timings.reused_tokens > 0, "the second request should reuse the shared system prompt");
    let mut fresh = Generator::new(common::load_on(&gpu, &path, CONTEXT));
    let (fresh_second, fresh_first) = (answer(&mut fresh, &second), answer(&mut fresh, &first));
    assert_eq!(fresh_second.timings.reused_tokens, 0);
    for (soaked, fresh) in [(&soaked_first, &fresh_first), (&soaked_second, &fresh_second)] {
        assert_eq!((&soaked.tokens, &soaked.text), (&fresh.tokens, &fresh.text), "the soaked engine drifted from a fresh one");
    }
}
