//! Generation as a user drives it: seeded sampling, stop strings, aborts, prefix reuse across
//! chat turns and across model instances (a saved KV prefix), context overflow, invalid options.

mod common;

use std::time::Duration;

use kestrel_engine::generation::{FinishReason, GenerateOptions, Generator, Prompt, DEFAULT_DECODE_RUN_AHEAD};
use kestrel_model::{ChatMessage, LoadOptions, ModelError};

fn chat(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", content)]
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 256));
    let prompt = model.encode(&Prompt::Chat(&chat("Name a color."))).unwrap();
    let run = |model: &mut Generator, seed| {
        let options = GenerateOptions {
            max_tokens: 6,
            seed: Some(seed),
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..GenerateOptions::default()
        };
        pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).unwrap().tokens
    };
    let first = run(&mut model, 7);
    assert_eq!(run(&mut model, 7), first, "same seed, same tokens");
    let others: Vec<Vec<u32>> = [1u64, 2, 3].iter().map(|&s| run(&mut model, s)).collect();
    assert!(others.iter().any(|o| *o != first), "three other seeds all gave {first:?}");
}

#[test]
fn stop_strings_stop_and_are_not_emitted() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 256));
    let prompt = model.encode(&Prompt::Text("The capital of France is")).unwrap();
    let free = pollster::block_on(model.generate(&prompt, &GenerateOptions { max_tokens: 12, ..GenerateOptions::greedy() }, &mut |_| true))
        .unwrap();
    // Stop at the third word of what the model writes unconstrained.
    let words: Vec<&str> = free.text.split_whitespace().collect();
    assert!(words.len() >= 4, "too little text to pick a stop string from: {:?}", free.text);
    let stop = words[2].to_string();
    let cut = free.text.find(&stop).unwrap();
    let options = GenerateOptions { max_tokens: 12, stop: vec![stop.clone()], ..GenerateOptions::greedy() };
    let mut streamed = String::new();
    let stopped = pollster::block_on(model.generate(&prompt, &options, &mut |e| {
        streamed.push_str(&e.text);
        true
    }))
    .unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, free.text[..cut], "stop string {stop:?}");
    assert_eq!(streamed, stopped.text, "streamed text equals the final text");
}

#[test]
fn abort_stops_at_the_next_token_and_the_engine_keeps_working() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 256));
    let prompt = model.encode(&Prompt::Chat(&chat("Count from one to twenty."))).unwrap();
    let mut seen = 0;
    let options = GenerateOptions { max_tokens: 20, ignore_eos: true, ..GenerateOptions::greedy() };
    let aborted = pollster::block_on(model.generate(&prompt, &options, &mut |_| {
        seen += 1;
        seen < 3
    }))
    .unwrap();
    assert_eq!(aborted.finish_reason, FinishReason::Abort);
    assert_eq!(aborted.tokens.len(), 3);
    let after = pollster::block_on(model.generate(
        &prompt,
        &GenerateOptions { max_tokens: 5, ignore_eos: true, ..GenerateOptions::greedy() },
        &mut |_| true,
    ))
    .unwrap();
    assert_eq!(after.finish_reason, FinishReason::Length);
    assert_eq!(after.tokens[..3], aborted.tokens[..], "greedy output is the same after an abort");
}

#[test]
fn follow_up_turn_reuses_the_cached_prefix_and_matches_a_fresh_run() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 512));
    let options = GenerateOptions { max_tokens: 8, ..GenerateOptions::greedy() };
    let mut messages = chat("Say hello.");
    let first_prompt = model.encode(&Prompt::Chat(&messages)).unwrap();
    let first = pollster::block_on(model.generate(&first_prompt, &options, &mut |_| true)).unwrap();
    messages.push(ChatMessage::new("assistant", first.text.clone()));
    messages.push(ChatMessage::new("user", "And goodbye?"));
    let second_prompt = model.encode(&Prompt::Chat(&messages)).unwrap();
    let second = pollster::block_on(model.generate(&second_prompt, &options, &mut |_| true)).unwrap();
    assert!(
        second.timings.reused_tokens >= first_prompt.len(),
        "reused {} of the {}-token first prompt",
        second.timings.reused_tokens,
        first_prompt.len()
    );
    assert_eq!(second.timings.prefill_tokens, second_prompt.len() - second.timings.reused_tokens);
    model.reset();
    let fresh = pollster::block_on(model.generate(&second_prompt, &options, &mut |_| true)).unwrap();
    assert_eq!(fresh.timings.reused_tokens, 0);
    assert_eq!(fresh.tokens, second.tokens, "reusing the cache changes nothing in the output");
}

/// A saved prefix restored into another instance of the model (zeroed caches, as after a page
/// reload) is reused by the next turn, which then generates exactly what a fresh run does; a
/// snapshot changed in any way, or tagged with another model's key, is refused and changes
/// nothing; a byte budget saves the longest prefix that fits, and a restore can keep fewer tokens.
#[test]
fn a_saved_prefix_restored_into_a_new_instance_is_reused_and_changes_nothing() {
    let path = common::default_model_path();
    let mut first_instance = Generator::new(common::load(&path, 512));
    let options = GenerateOptions { max_tokens: 8, ..GenerateOptions::greedy() };
    let mut messages = chat("Say hello.");
    let first_prompt = first_instance.encode(&Prompt::Chat(&messages)).unwrap();
    let first = pollster::block_on(first_instance.generate(&first_prompt, &options, &mut |_| true)).unwrap();
    let snapshot = pollster::block_on(first_instance.model().save_prefix("model-sha256", u64::MAX)).unwrap().expect("tokens are cached");
    let saved = first_instance.model().cached_token_ids().to_vec();
    assert!(saved.len() > first_prompt.len());
    // Ten tokens fewer than the whole: each token's rows take the same bytes.
    let per_token = (snapshot.len() - 4 * saved.len()) / saved.len();
    let budget = (snapshot.len() - 10 * (per_token + 4)) as u64;
    let shorter = pollster::block_on(first_instance.model().save_prefix("model-sha256", budget)).unwrap().expect("a prefix fits");
    assert!(shorter.len() as u64 <= budget && shorter.len() > budget as usize - per_token - 4, "{} bytes in {budget}", shorter.len());
    assert_eq!(pollster::block_on(first_instance.model().save_prefix("model-sha256", 16)).unwrap(), None, "no token fits 16 bytes");

    messages.push(ChatMessage::new("assistant", first.text.clone()));
    messages.push(ChatMessage::new("user", "And goodbye?"));
    let second_prompt = first_instance.encode(&Prompt::Chat(&messages)).unwrap();
    first_instance.reset();
    let fresh = pollster::block_on(first_instance.generate(&second_prompt, &options, &mut |_| true)).unwrap();
    drop(first_instance);

    let mut restored = Generator::new(common::load(&path, 512));
    let shared = saved.iter().zip(&second_prompt).take_while(|(a, b)| a == b).count();
    assert!(shared > first_prompt.len() / 2, "the follow-up shares {shared} tokens with the saved prefix");
    // Fewer rows than the snapshot holds, into an empty cache: each layer's rows are read at the
    // snapshot's stride, and the follow-up reuses exactly those and prefills the rest.
    let keep = shared - 2;
    assert_eq!(restored.model_mut().expect("no sequence runs").restore_prefix("model-sha256", &snapshot, keep).unwrap(), keep);
    assert_eq!(restored.model().cached_token_ids(), &saved[..keep]);
    let second = pollster::block_on(restored.generate(&second_prompt, &options, &mut |_| true)).unwrap();
    assert_eq!(second.timings.reused_tokens, keep);
    assert_eq!(second.tokens, fresh.tokens, "the restored prefix changes nothing in the output");

    // The budget-cut snapshot restores too; a refused snapshot then leaves its prefix as it is.
    assert_eq!(restored.model_mut().expect("no sequence runs").restore_prefix("model-sha256", &shorter, 5).unwrap(), 5);
    assert_eq!(restored.model().cached_token_ids(), &saved[..5]);
    let mut corrupt = snapshot.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 1;
    for (key, bytes, code) in [("model-sha256", &corrupt, "bad_snapshot"), ("another-model", &snapshot, "snapshot_mismatch")] {
        let refused = restored.model_mut().expect("no sequence runs").restore_prefix(key, bytes, usize::MAX).unwrap_err();
        assert_eq!(refused.code(), code, "{refused}");
        assert_eq!(restored.model().cached_token_ids(), &saved[..5], "a refused snapshot changed the cached prefix");
    }
    assert_eq!(restored.model_mut().expect("no sequence runs").restore_prefix("model-sha256", &snapshot, usize::MAX).unwrap(), saved.len());
    assert_eq!(restored.model().cached_token_ids(), saved);
}

#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 32));
    let prompt: Vec<u32> = (0..40).map(|i| 100 + i).collect();
    let err = pollster::block_on(model.generate(&prompt, &GenerateOptions::greedy(), &mut |_| true)).unwrap_err();
    assert!(matches!(err, ModelError::ContextOverflow { needed: 41, context: 32 }), "{err}");
    assert_eq!(err.code(), "context_overflow");
    // The model still works.
    let ok =
        pollster::block_on(model.generate(&prompt[..8], &GenerateOptions { max_tokens: 2, ..GenerateOptions::greedy() }, &mut |_| true));
    assert!(ok.is_ok());
}

#[test]
fn generation_ends_with_length_when_the_context_fills() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 16));
    let prompt: Vec<u32> = (0..12).map(|i| 100 + i).collect();
    let options = GenerateOptions { max_tokens: 100, ignore_eos: true, ..GenerateOptions::greedy() };
    let g = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(prompt.len() + g.tokens.len(), 16 + 1, "the last token is sampled but never fed back");
}

#[test]
fn invalid_options_and_token_ids_are_errors() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 64));
    let bad = GenerateOptions { top_p: 1.5, ..GenerateOptions::default() };
    let err = pollster::block_on(model.generate(&[1, 2, 3], &bad, &mut |_| true)).unwrap_err();
    assert!(matches!(err, ModelError::InvalidOption { name: "top_p", .. }), "{err}");
    let err = pollster::block_on(model.generate(&[1, 999_999], &GenerateOptions::greedy(), &mut |_| true)).unwrap_err();
    assert_eq!(err.code(), "invalid_option");
    assert!(pollster::block_on(model.generate(&[], &GenerateOptions::greedy(), &mut |_| true)).is_err());
}

/// Decode steps submitted ahead of the token being read (the sampled token fed back on the GPU)
/// change nothing: greedy and seeded sampling give the same tokens with 1, 2 and 4 steps in
/// flight, a request stopped or aborted with steps still in flight leaves the cached prefix
/// consistent (the next request equals a fresh run), and max_tokens is exact.
#[test]
fn decode_steps_run_ahead_change_nothing() {
    let model = Generator::new(common::load(&common::default_model_path(), 256));
    assert_eq!(model.decode_run_ahead(), DEFAULT_DECODE_RUN_AHEAD, "the GPU's default");
    run_ahead_changes_nothing(model);
}

/// The same policy on the CPU backend, whose steps run at once: the steps run ahead are computed
/// before their tokens are read, and a stop or an abort discards them just as well. It starts
/// with none ahead, since there they would overlap nothing and only hold tokens back.
#[test]
fn decode_steps_run_ahead_change_nothing_on_the_cpu() {
    let model = Generator::new(common::load_cpu(&common::default_model_path(), 256));
    assert_eq!(model.decode_run_ahead(), 1, "the CPU backend's default");
    run_ahead_changes_nothing(model);
}

fn run_ahead_changes_nothing(mut model: Generator) {
    let prompt = model.encode(&Prompt::Chat(&chat("Name three animals."))).unwrap();
    let greedy = GenerateOptions { max_tokens: 10, ignore_eos: true, ..GenerateOptions::greedy() };
    let sampled = GenerateOptions { max_tokens: 10, ignore_eos: true, seed: Some(11), temperature: 0.9, ..GenerateOptions::default() };
    let mut outputs = Vec::new();
    for ahead in [1, 2, 4] {
        model.set_decode_run_ahead(ahead).unwrap();
        let g = pollster::block_on(model.generate(&prompt, &greedy, &mut |_| true)).unwrap();
        let s = pollster::block_on(model.generate(&prompt, &sampled, &mut |_| true)).unwrap();
        assert_eq!((g.tokens.len(), s.tokens.len()), (10, 10), "{ahead} ahead: max_tokens is exact");
        // The host's waits for tokens are part of the decode time.
        let t = &g.timings;
        let waited = t.host_wait_ms_per_token * t.decode_tokens as f64;
        assert!(waited > 0.0 && waited <= t.decode_ms, "{ahead} ahead: waited {waited} ms of a {} ms decode", t.decode_ms);
        outputs.push((ahead, g.tokens, s.tokens));
    }
    for (ahead, g, s) in &outputs[1..] {
        assert_eq!(*g, outputs[0].1, "greedy with {ahead} steps ahead");
        assert_eq!(*s, outputs[0].2, "seeded sampling with {ahead} steps ahead");
    }

    // Abort after 2 tokens with 4 steps in flight, then a follow-up on the same prefix.
    model.set_decode_run_ahead(4).unwrap();
    let mut seen = 0;
    let aborted = pollster::block_on(model.generate(&prompt, &greedy, &mut |_| {
        seen += 1;
        seen < 2
    }))
    .unwrap();
    assert_eq!((aborted.finish_reason, aborted.tokens.len()), (FinishReason::Abort, 2));
    let follow = [prompt.clone(), aborted.tokens.clone(), model.encode(&Prompt::Text(" and")).unwrap()].concat();
    let reused = pollster::block_on(model.generate(&follow, &greedy, &mut |_| true)).unwrap();
    assert!(reused.timings.reused_tokens > prompt.len(), "the aborted request's tokens are reused");
    model.reset();
    let fresh = pollster::block_on(model.generate(&follow, &greedy, &mut |_| true)).unwrap();
    assert_eq!(reused.tokens, fresh.tokens, "steps run ahead of an abort leave no trace");
    assert!(model.set_decode_run_ahead(0).is_err() && model.set_decode_run_ahead(5).is_err());
}

/// A submission budget (what the browser engine sets so the page keeps drawing) cuts a prompt's
/// chunks into pieces of whole layers, each submitted after the previous one ended: the same
/// logits bits and tokens as one submission a chunk. A budget no layer fits gives one piece a
/// layer; the timings count the pieces and give the longest, within the time to first token.
#[test]
fn a_submission_budget_cuts_prefill_into_pieces_and_changes_nothing() {
    let options = LoadOptions { context_length: Some(64), max_chunk: 4, ..LoadOptions::default() };
    let mut model = Generator::new(common::load_with(&common::gpu(), &common::default_model_path(), options));
    let layers = model.model().config().n_layers;
    // Two chunks: 4 tokens and 2.
    let prompt = common::bench_ids(6);
    let greedy = GenerateOptions { max_tokens: 4, ignore_eos: true, ..GenerateOptions::greedy() };
    let bits = |logits: Vec<f32>| logits.into_iter().map(f32::to_bits).collect::<Vec<_>>();

    let whole_logits = bits(pollster::block_on(model.model_mut().expect("no sequence runs").prompt_logits(&prompt)).unwrap());
    model.reset();
    let whole = pollster::block_on(model.generate(&prompt, &greedy, &mut |_| true)).unwrap();
    assert_eq!((whole.timings.prefill_submissions, whole.timings.longest_prefill_submission_ms), (None, None));

    model.model_mut().expect("no sequence runs").set_submit_budget(Some(Duration::from_nanos(1))).unwrap();
    assert_eq!(
        bits(pollster::block_on(model.model_mut().expect("no sequence runs").prompt_logits(&prompt)).unwrap()),
        whole_logits,
        "logits in pieces"
    );
    model.reset();
    let paced = pollster::block_on(model.generate(&prompt, &greedy, &mut |_| true)).unwrap();
    assert_eq!(paced.tokens, whole.tokens);
    let t = &paced.timings;
    assert_eq!(t.prefill_submissions, Some(2 * layers), "one piece a layer of each chunk");
    let longest = t.longest_prefill_submission_ms.expect("paced");
    assert!(longest > 0.0 && longest <= t.ttft_ms, "longest piece {longest} ms of a {} ms prefill", t.ttft_ms);

    // A budget every layer fits: after the first piece (one layer, measured) larger pieces.
    model.model_mut().expect("no sequence runs").set_submit_budget(Some(Duration::from_secs(1))).unwrap();
    model.reset();
    let roomy = pollster::block_on(model.generate(&prompt, &greedy, &mut |_| true)).unwrap();
    assert_eq!(roomy.tokens, whole.tokens);
    let pieces = roomy.timings.prefill_submissions.expect("paced");
    assert!((2..2 * layers).contains(&pieces), "{pieces} pieces for 2 chunks of {layers} layers");

    for bad in [Duration::ZERO, Duration::from_millis(1001)] {
        assert!(matches!(
            model.model_mut().expect("no sequence runs").set_submit_budget(Some(bad)),
            Err(ModelError::InvalidOption { name: "submit_budget_ms", .. })
        ));
    }
    model.model_mut().expect("no sequence runs").set_submit_budget(None).unwrap();
    assert_eq!(model.model().submit_budget(), None);
}

/// Batched sequences on the GPU: prompts with the prefill kernels, decodes of several sequences
/// as one step whose products read each weight once for all of them, each sequence sampled on
/// the device by its slot's sampler. Each gives exactly what it gives alone (greedy, logprobs,
/// a seeded draw with penalties), also with the prompts' chunks submitted in pieces of a layer
/// (a submission budget no layer fits), and the slots are the ones the model was loaded with.
#[test]
fn gpu_batched_sequences_give_what_each_gives_alone() {
    let options = kestrel_model::LoadOptions { context_length: Some(256), slots: 4, ..kestrel_model::LoadOptions::default() };
    let mut model = Generator::new(common::load_with(&common::gpu(), &common::default_model_path(), options));
    assert_eq!(model.slots(), 4, "the GPU model has the slots it was loaded with");
    // Short requests: lavapipe runs a few tokens a second.
    let requests = common::mixed_requests(12, 6);
    let alone = common::generate_alone(&mut model, &requests);
    model.reset();
    // Prompts enter 16 tokens a step, interleaved with the others' decodes, a layer a submission.
    model.model_mut().expect("no sequence runs").set_submit_budget(Some(Duration::from_nanos(1))).unwrap();
    common::assert_batched_as_alone(&mut model, &requests, &alone, 16);
    assert_eq!(model.set_slots(5).expect_err("more slots than loaded").code(), "invalid_option");
    model.set_slots(2).expect("fewer slots than loaded");
    assert_eq!(model.slots(), 2);
}

/// A sequence running alone has its decode steps run ahead; when a second one joins, the steps
/// in flight are read first and both go on in batched steps. Neither changes: each gives what it
/// gives alone (the first sampled with a seed, the second greedy), on both backends.
#[test]
fn a_sequence_joining_one_that_runs_ahead_changes_neither() {
    let options = LoadOptions { context_length: Some(256), slots: 2, ..LoadOptions::default() };
    joining_changes_nothing(Generator::new(common::load_with(&common::gpu(), &common::default_model_path(), options)));
    let mut cpu = Generator::new(common::load_cpu(&common::default_model_path(), 256));
    cpu.set_slots(2).expect("two slots");
    joining_changes_nothing(cpu);
}

fn joining_changes_nothing(mut model: Generator) {
    use kestrel_engine::generation::SequenceEvent;
    let sampled = GenerateOptions { max_tokens: 16, ignore_eos: true, seed: Some(5), temperature: 0.8, ..GenerateOptions::default() };
    let greedy = GenerateOptions { max_tokens: 6, ignore_eos: true, ..GenerateOptions::greedy() };
    let requests = [(common::bench_ids(12), sampled), (common::bench_ids(7), greedy)];
    let alone = common::generate_alone(&mut model, &requests);
    model.reset();
    let mut ids = vec![model.add_sequence(&requests[0].0, &requests[0].1).expect("add the first")];
    let mut tokens = [Vec::new(), Vec::new()];
    let mut ended = 0;
    let mut steps = 0;
    while model.running_sequences() > 0 {
        // The first runs alone for its prompt and five decode steps, then the second joins.
        if steps == 6 {
            ids.push(model.add_sequence(&requests[1].0, &requests[1].1).expect("add the second"));
        }
        for (id, event) in pollster::block_on(model.step(64)).events {
            let i = ids.iter().position(|&x| x == id).expect("an event of an added sequence");
            match event {
                SequenceEvent::Token(t) => tokens[i].extend(t.id),
                SequenceEvent::Done(result) => {
                    assert_eq!(result.expect("the sequence succeeds").tokens, alone[i].tokens, "sequence {i}");
                    ended += 1;
                }
            }
        }
        steps += 1;
    }
    assert_eq!(ended, 2);
    assert_eq!(tokens[0], alone[0].tokens, "the first's streamed tokens");
    assert_eq!(tokens[1], alone[1].tokens, "the second's streamed tokens");
}

/// A caller that stops listening at the token that also ends the generation (its last by
/// `max_tokens`) gets the generation, with all of its text streamed, not an error.
#[test]
fn stopping_at_the_last_token_returns_the_generation() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 256));
    let options = GenerateOptions { max_tokens: 3, ignore_eos: true, ..GenerateOptions::greedy() };
    let (mut seen, mut streamed) = (0, String::new());
    let generation = pollster::block_on(model.generate(&common::bench_ids(8), &options, &mut |event| {
        streamed.push_str(&event.text);
        seen += usize::from(event.id.is_some());
        seen < 3
    }))
    .expect("the generation, not an error");
    assert_eq!(generation.tokens.len(), 3);
    assert_eq!(streamed, generation.text, "every piece of the text was streamed");
}
