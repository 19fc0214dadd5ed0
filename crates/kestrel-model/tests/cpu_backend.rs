//! The CPU backend as generation uses it. Its greedy tokens against llama.cpp's are in
//! greedy.rs; here, what holds because every CPU kernel computes each token's row on its own
//! (activations quantized per row, attention per token and head, a thread pool that splits
//! rows, never a sum): the logits of a token do not depend on how its prompt was split into
//! chunks, nor on whether it ran as a prompt token or a decode step, to the bit.

mod common;

use kestrel_model::{GenerateOptions, LoadOptions, Model};

fn load(max_chunk: usize) -> Model {
    let options = LoadOptions { context_length: Some(256), max_chunk, ..LoadOptions::default() };
    pollster::block_on(kestrel_model::load_file_cpu(&common::default_model_path(), options, &mut |_| {})).expect("load on the CPU backend")
}

fn bench_ids(n: usize) -> Vec<u32> {
    common::ids(&common::greedy_reference()["bench_prompt"]["ids"])[..n].to_vec()
}

#[test]
fn prefill_chunks_and_decode_steps_give_the_same_logits() {
    let prompt = bench_ids(40);
    let whole = pollster::block_on(load(128).prompt_logits(&prompt)).expect("one chunk");
    let chunked = pollster::block_on(load(7).prompt_logits(&prompt)).expect("chunks of 7");
    assert_eq!(whole, chunked, "chunks of 7 tokens changed the logits");

    // Greedy decode steps, then the same tokens as one prompt: the last step's logits (read
    // through logprobs) and the prompt's agree exactly.
    let mut model = load(128);
    let options = GenerateOptions { max_tokens: 4, ignore_eos: true, logprobs: 1, ..GenerateOptions::greedy() };
    let generation = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("generate");
    assert_eq!(generation.tokens.len(), 4);
    let extended: Vec<u32> = prompt.iter().chain(&generation.tokens[..3]).copied().collect();
    let logits = pollster::block_on(model.prompt_logits(&extended)).expect("prompt of the generated tokens");
    assert_eq!(common::argmax(&logits) as u32, generation.tokens[3]);
    let last = &generation.logprobs[3];
    let logprobs = common::log_softmax(&logits);
    // Equal logits leave only the two log-softmaxes' own rounding (f32 against f64 here).
    assert!((logprobs[last.token as usize] as f32 - last.logprob).abs() <= 1e-6, "decode step and prompt differ");
}

#[test]
fn cached_prefix_and_seeded_sampling_repeat_exactly() {
    let mut model = load(128);
    let prompt = bench_ids(24);
    let options =
        GenerateOptions { max_tokens: 12, temperature: 0.9, top_k: 40, seed: Some(7), ignore_eos: true, ..GenerateOptions::default() };
    let cold = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("cold");
    let warm = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("warm");
    assert_eq!(warm.timings.reused_tokens, prompt.len() - 1, "the second request reuses the cached prompt");
    assert_eq!(cold.tokens, warm.tokens);
    let other_seed = GenerateOptions { seed: Some(8), ..options.clone() };
    let other = pollster::block_on(model.generate(&prompt, &other_seed, &mut |_| true)).expect("other seed");
    assert_ne!(other.tokens, cold.tokens, "seeds 7 and 8 drew the same 12 tokens");
    let penalized = GenerateOptions { repetition_penalty: 1.5, penalty_last_n: 64, ..GenerateOptions::greedy() };
    let plain =
        pollster::block_on(model.generate(&prompt, &GenerateOptions { max_tokens: 24, ..GenerateOptions::greedy() }, &mut |_| true))
            .expect("greedy");
    let penalized =
        pollster::block_on(model.generate(&prompt, &GenerateOptions { max_tokens: 24, ..penalized }, &mut |_| true)).expect("penalized");
    assert_ne!(plain.tokens, penalized.tokens, "a repetition penalty of 1.5 changed nothing in 24 tokens");
}

#[test]
fn gpu_only_features_are_coded_errors() {
    let model = load(128);
    assert_eq!(model.backend(), kestrel_model::BackendKind::Cpu);
    assert!(model.gpu().is_none());
    let err = pollster::block_on(model.save_prefix("key", 1 << 20)).expect_err("snapshots need the GPU");
    assert_eq!(err.code(), "needs_gpu");
}

/// Runs the model's batched sequences to their ends, `prefill` prompt tokens a step; returns
/// each one's events (token texts, then the generation) in the order added.
fn run_batched(model: &mut Model, requests: &[(Vec<u32>, GenerateOptions)], prefill: usize) -> Vec<(String, kestrel_model::Generation)> {
    use kestrel_model::SequenceEvent;
    let ids: Vec<_> = requests.iter().map(|(prompt, options)| model.add_sequence(prompt, options).expect("add")).collect();
    let mut streamed = vec![String::new(); ids.len()];
    let mut done: Vec<Option<kestrel_model::Generation>> = vec![None; ids.len()];
    let mut batched_decodes = 0;
    while model.running_sequences() > 0 {
        let step = model.step_sequences(prefill);
        assert!(step.sequences > 0 && step.rows >= step.sequences, "a step with sequences running ran nothing");
        if step.decoding > 1 {
            batched_decodes += 1;
        }
        for (id, event) in step.events {
            let i = ids.iter().position(|&x| x == id).expect("an event of an added sequence");
            assert!(done[i].is_none(), "an event after the sequence ended");
            match event {
                SequenceEvent::Token(t) => streamed[i].push_str(&t.text),
                SequenceEvent::Done(result) => done[i] = Some(result.expect("the sequence succeeds")),
            }
        }
    }
    assert!(batched_decodes > 0, "no step decoded several sequences together");
    assert_eq!(model.free_slots(), model.slots(), "every slot is free at the end");
    streamed.into_iter().zip(done).map(|(s, g)| (s, g.expect("every sequence ended"))).collect()
}

#[test]
fn batched_sequences_give_what_each_gives_alone() {
    let long = bench_ids(40);
    let greedy = |max_tokens| GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::greedy() };
    let requests = vec![
        (long.clone(), greedy(12)),
        (bench_ids(5), GenerateOptions { logprobs: 3, ..greedy(9) }),
        (
            bench_ids(17),
            GenerateOptions {
                max_tokens: 10,
                temperature: 0.9,
                top_k: 40,
                seed: Some(11),
                repetition_penalty: 1.3,
                penalty_last_n: 32,
                ignore_eos: true,
                ..GenerateOptions::default()
            },
        ),
        (long[..23].to_vec(), greedy(6)),
    ];
    let mut alone_model = load(128);
    let alone: Vec<_> = requests
        .iter()
        .map(|(prompt, options)| {
            alone_model.reset();
            pollster::block_on(alone_model.generate(prompt, options, &mut |_| true)).expect("alone")
        })
        .collect();

    let mut model = load(128);
    model.set_slots(4).expect("4 slots");
    // Prompts enter 8 tokens a step, interleaved with the others' decode steps.
    for ((streamed, batched), want) in run_batched(&mut model, &requests, 8).into_iter().zip(&alone) {
        assert_eq!(batched.tokens, want.tokens, "batched tokens differ from the request alone");
        assert_eq!(batched.text, want.text);
        assert_eq!(streamed, want.text, "the streamed text is the generation's");
        assert_eq!(batched.finish_reason, want.finish_reason);
        assert_eq!(batched.logprobs, want.logprobs);
    }

    // Each slot keeps its sequence's tokens: the same prompt again reuses all but its last.
    let again = run_batched(&mut model, &requests[..2], 64);
    assert_eq!(again[0].1.timings.reused_tokens, long.len() - 1);
    assert_eq!(again[1].1.timings.reused_tokens, 4);
    assert_eq!(again[0].1.tokens, alone[0].tokens);
    assert_eq!(again[1].1.tokens, alone[1].tokens);
}

#[test]
fn sequences_abort_free_their_slot_and_refuse_what_generate_refuses() {
    let mut model = load(128);
    model.set_slots(2).expect("2 slots");
    let options = GenerateOptions { max_tokens: 50, ignore_eos: true, ..GenerateOptions::greedy() };
    let first = model.add_sequence(&bench_ids(6), &options).expect("first");
    model.add_sequence(&bench_ids(9), &options).expect("second");
    let full = model.add_sequence(&bench_ids(3), &options).expect_err("a third with 2 slots");
    assert_eq!(full.code(), "invalid_option");
    let busy = pollster::block_on(model.generate(&bench_ids(3), &options, &mut |_| true)).expect_err("generate while sequences run");
    assert_eq!(busy.code(), "invalid_option");
    assert_eq!(model.set_slots(3).expect_err("resizing while sequences run").code(), "invalid_option");
    for _ in 0..4 {
        model.step_sequences(64);
    }
    let aborted = model.abort_sequence(first).expect("the first runs");
    assert_eq!(aborted.finish_reason, kestrel_model::FinishReason::Abort);
    assert_eq!(aborted.tokens.len(), 4, "one token a step after the prompt's");
    assert!(model.abort_sequence(first).is_none(), "an ended sequence aborts once");
    assert_eq!(model.free_slots(), 1);
    let bad = GenerateOptions { top_p: 2.0, ..options.clone() };
    assert_eq!(model.add_sequence(&bench_ids(3), &bad).expect_err("top_p 2").code(), "invalid_option");
    let too_long = vec![1; 256];
    assert_eq!(model.add_sequence(&too_long, &options).expect_err("prompt over the context").code(), "context_overflow");
    assert_eq!(model.set_slots(0).expect_err("no slots").code(), "invalid_option");
}
