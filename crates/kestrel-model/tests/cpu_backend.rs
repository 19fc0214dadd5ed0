//! The CPU backend as generation uses it. Its greedy tokens against llama.cpp's are in
//! greedy.rs; here, what holds because every CPU kernel computes each token's row on its own
//! (activations quantized per row, attention per token and head, a thread pool that splits
//! rows, never a sum): the logits of a token do not depend on how its prompt was split into
//! chunks, nor on whether it ran as a prompt token or a decode step, to the bit.

mod common;

use kestrel_engine::generation::{GenerateOptions, Generator};
use kestrel_model::LoadOptions;

fn load(max_chunk: usize) -> Generator {
    let options = LoadOptions { context_length: Some(256), max_chunk, ..LoadOptions::default() };
    Generator::new(
        pollster::block_on(kestrel_model::load_file_cpu(&common::default_model_path(), options, &mut |_| {}))
            .expect("load on the CPU backend"),
    )
}

#[test]
fn prefill_chunks_and_decode_steps_give_the_same_logits() {
    let prompt = common::bench_ids(40);
    let whole = pollster::block_on(load(128).into_model().prompt_logits(&prompt)).expect("one chunk");
    let chunked = pollster::block_on(load(7).into_model().prompt_logits(&prompt)).expect("chunks of 7");
    assert_eq!(whole, chunked, "chunks of 7 tokens changed the logits");

    // Greedy decode steps, then the same tokens as one prompt: the last step's logits (read
    // through logprobs) and the prompt's agree exactly.
    let mut model = load(128);
    let options = GenerateOptions { max_tokens: 4, ignore_eos: true, logprobs: 1, ..GenerateOptions::greedy() };
    let generation = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("generate");
    assert_eq!(generation.tokens.len(), 4);
    let extended: Vec<u32> = prompt.iter().chain(&generation.tokens[..3]).copied().collect();
    let logits =
        pollster::block_on(model.model_mut().expect("no sequence runs").prompt_logits(&extended)).expect("prompt of the generated tokens");
    assert_eq!(common::argmax(&logits) as u32, generation.tokens[3]);
    let last = &generation.logprobs[3];
    let logprobs = common::log_softmax(&logits);
    // Equal logits leave only the two log-softmaxes' own rounding (f32 against f64 here).
    assert!((logprobs[last.token as usize] as f32 - last.logprob).abs() <= 1e-6, "decode step and prompt differ");
}

#[test]
fn cached_prefix_and_seeded_sampling_repeat_exactly() {
    let mut model = load(128);
    // A GPU submission budget (the browser engine sets one on every backend) paces nothing here.
    model.model_mut().expect("no sequence runs").set_submit_budget(Some(std::time::Duration::from_millis(8))).expect("a budget in range");
    assert_eq!(model.model().submit_budget(), None, "the CPU backend keeps no submission budget");
    let prompt = common::bench_ids(24);
    let options =
        GenerateOptions { max_tokens: 12, temperature: 0.9, top_k: 40, seed: Some(7), ignore_eos: true, ..GenerateOptions::default() };
    let cold = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("cold");
    assert_eq!((cold.timings.prefill_submissions, cold.timings.longest_prefill_submission_ms), (None, None));
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
    assert_eq!(model.model().backend(), kestrel_model::BackendKind::Cpu);
    assert!(model.model().gpu().is_none());
    let err = pollster::block_on(model.model().save_prefix("key", 1 << 20)).expect_err("snapshots need the GPU");
    assert_eq!(err.code(), "needs_gpu");
}

#[test]
fn batched_sequences_give_what_each_gives_alone() {
    let requests = common::mixed_requests(40, 12);
    let alone = common::generate_alone(&mut load(128), &requests);
    let mut model = load(128);
    model.set_slots(4).expect("4 slots");
    common::assert_batched_as_alone(&mut model, &requests, &alone, 8);
}

#[test]
fn sequences_abort_free_their_slot_and_refuse_what_generate_refuses() {
    let mut model = load(128);
    model.set_slots(2).expect("2 slots");
    let options = GenerateOptions { max_tokens: 50, ignore_eos: true, ..GenerateOptions::greedy() };
    let first = model.add_sequence(&common::bench_ids(6), &options).expect("first");
    model.add_sequence(&common::bench_ids(9), &options).expect("second");
    let full = model.add_sequence(&common::bench_ids(3), &options).expect_err("a third with 2 slots");
    assert_eq!(full.code(), "invalid_option");
    let busy =
        pollster::block_on(model.generate(&common::bench_ids(3), &options, &mut |_| true)).expect_err("generate while sequences run");
    assert_eq!(busy.code(), "invalid_option");
    assert_eq!(model.set_slots(3).expect_err("resizing while sequences run").code(), "invalid_option");
    for _ in 0..4 {
        pollster::block_on(model.step(64));
    }
    let aborted = model.abort_sequence(first).expect("the first runs");
    assert_eq!(aborted.finish_reason, kestrel_engine::generation::FinishReason::Abort);
    assert_eq!(aborted.tokens.len(), 4, "one token a step after the prompt's");
    assert!(model.abort_sequence(first).is_none(), "an ended sequence aborts once");
    assert_eq!(model.free_slots(), 1);
    let bad = GenerateOptions { top_p: 2.0, ..options.clone() };
    assert_eq!(model.add_sequence(&common::bench_ids(3), &bad).expect_err("top_p 2").code(), "invalid_option");
    let too_long = vec![1; 256];
    assert_eq!(model.add_sequence(&too_long, &options).expect_err("prompt over the context").code(), "context_overflow");
    assert_eq!(model.set_slots(0).expect_err("no slots").code(), "invalid_option");
}
