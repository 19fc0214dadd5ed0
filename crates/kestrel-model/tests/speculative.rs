//! Speculative decoding (kestrel-engine's `generation::speculation`): a draft by prompt lookup
//! or by a draft model, verified by the target in one multi-row step, on both backends.
//!
//! - **Greedy**: the tokens are plain greedy decoding's, to the token. On the CPU backend a
//!   token's logits do not depend on whether it ran as a decode step or as a row of a longer
//!   step (cpu_backend.rs), so the check is exact: no near-tie is excused. On the GPU a
//!   verification runs the prefill kernels, which round differently from the decode kernels: the
//!   tokens may part where plain decoding's own top-2 margin is under `GPU_NEAR_TIE`, and the
//!   test reports every such margin.
//! - **Sampled**: the rejection rule keeps the target's distribution. A chi-square test over
//!   thousands of seeded requests compares the joint distribution of the first two tokens, the
//!   second of which the rule decided, with the target's own probabilities.
//! - Everything a request carries goes through: penalties, a constraint, logprobs, stop strings,
//!   `max_tokens`, batching, prefix reuse, a draft model's vocabulary check.

mod common;

use common::synthetic::{QWEN2_F32, QWEN2_Q8_0};
use kestrel_engine::generation::speculation::SpeculativeOptions;
use kestrel_engine::generation::{GenerateOptions, Generator, JsonSchemaFormat, Prompt, ResponseFormat};
use kestrel_engine::Generation;
use kestrel_model::{ChatMessage, Model};
use kestrel_ops::params::SamplingParams;
use kestrel_ops::reference::sample::distribution;

const CONTEXT: usize = 512;

fn smollm2() -> Model {
    common::load_cpu(&common::default_model_path(), CONTEXT)
}

fn lookup() -> SpeculativeOptions {
    SpeculativeOptions { lookup: true, draft_max: 8, p_min: 0.75 }
}

/// A prompt that asks for a given text back, as an edit does: lookup drafts its runs.
fn edit_prompt(g: &Generator) -> Vec<u32> {
    let text = "fn area(width: u32, height: u32) -> u32 {\n    let area = width * height;\n    println!(\"area: {}\", area);\n    area\n}";
    let messages =
        [ChatMessage::new("user", format!("Rename the function to `rect_area` and return the whole code:\n```rust\n{text}\n```"))];
    g.encode(&Prompt::Chat(&messages)).expect("encode")
}

fn generate(g: &mut Generator, prompt: &[u32], options: &GenerateOptions) -> Generation {
    g.reset();
    pollster::block_on(g.generate(prompt, options, &mut |_| true)).expect("generate")
}

/// The same request plainly and speculatively (the cache reset before each): the speculative
/// generation, after asserting that its tokens, text, logprobs and end are the plain ones.
fn assert_as_plain(g: &mut Generator, prompt: &[u32], options: &GenerateOptions) -> Generation {
    let plain = generate(g, prompt, &GenerateOptions { speculative: false, ..options.clone() });
    assert!(plain.speculative.is_none(), "speculative: false is plain decoding");
    let spec = generate(g, prompt, options);
    assert_eq!(spec.tokens, plain.tokens, "speculative tokens differ from plain decoding's");
    assert_eq!(spec.text, plain.text);
    assert_eq!(spec.finish_reason, plain.finish_reason);
    assert_eq!(spec.logprobs, plain.logprobs);
    spec
}

#[test]
fn prompt_lookup_gives_plain_greedy_tokens_several_per_step() {
    let mut g = Generator::new(smollm2());
    g.set_speculation(lookup(), None).expect("lookup");
    let prompt = edit_prompt(&g);
    let options = GenerateOptions { max_tokens: 64, ..GenerateOptions::greedy() };
    let spec = assert_as_plain(&mut g, &prompt, &options);
    let stats = spec.speculative.expect("speculation served the request");
    eprintln!("lookup: {stats:?}, {:.2} tokens per verifying step", stats.tokens_per_step());
    assert!(stats.accepted > 0 && stats.tokens_per_step() > 1.5, "an edit repeats its prompt: {stats:?}");

    // With penalties, logprobs, a stop string and a token budget that ends inside a draft.
    let options = GenerateOptions {
        max_tokens: 37,
        repetition_penalty: 1.2,
        penalty_last_n: 16,
        logprobs: 2,
        stop: vec!["println".into()],
        ..GenerateOptions::greedy()
    };
    assert_as_plain(&mut g, &prompt, &options);
    assert_as_plain(&mut g, &prompt, &GenerateOptions { max_tokens: 23, ..GenerateOptions::greedy() });
}

#[test]
fn a_constrained_output_is_verified_under_its_constraint() {
    let mut g = Generator::new(smollm2());
    g.set_speculation(lookup(), None).expect("lookup");
    let messages =
        [ChatMessage::new("user", "Return this JSON as it is: {\"name\": \"Ada Lovelace\", \"born\": 1815, \"field\": \"mathematics\"}")];
    let prompt = g.encode(&Prompt::Chat(&messages)).expect("encode");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "field": {"type": "string"}},
        "required": ["name", "born", "field"],
        "additionalProperties": false
    });
    let format = ResponseFormat::JsonSchema {
        json_schema: JsonSchemaFormat { name: "person".into(), description: None, schema: Some(schema), strict: Some(true) },
    };
    let options = GenerateOptions { max_tokens: 48, response_format: Some(format), ..GenerateOptions::greedy() };
    let spec = assert_as_plain(&mut g, &prompt, &options);
    serde_json::from_str::<serde_json::Value>(&spec.text).expect("the output is the schema's JSON");
    assert!(spec.speculative.expect("speculated").accepted > 0);
}

#[test]
fn a_draft_model_gives_plain_greedy_tokens() {
    // The target as its own draft: every greedy draft stands, so each verification keeps all
    // its rows (a wrong position or a stale cache row would make some fall).
    let mut g = Generator::new(smollm2());
    g.set_speculation(SpeculativeOptions { lookup: false, draft_max: 4, p_min: 0.0 }, Some(smollm2())).expect("draft model");
    let prompt = common::bench_ids(24);
    let options = GenerateOptions { max_tokens: 40, ignore_eos: true, ..GenerateOptions::greedy() };
    let stats = assert_as_plain(&mut g, &prompt, &options).speculative.expect("speculated");
    assert!(stats.drafted > 0);
    assert_eq!(stats.accepted, stats.drafted, "the model's own greedy drafts all stand: {stats:?}");
    // Again: the draft's slot reuses its prefix as the target's does.
    let again = pollster::block_on(g.generate(&prompt, &options, &mut |_| true)).expect("again");
    assert_eq!(again.timings.reused_tokens, prompt.len() - 1);
    // A stale row in the draft's reused slot would make some of its own drafts fall.
    let again = again.speculative.expect("speculated");
    assert!(again.drafted > 0 && again.accepted == again.drafted, "{again:?}");

    // A draft model of another architecture and random weights (the same vocabulary): most of
    // its drafts fall, and the tokens are still the target's.
    let mut g = Generator::new(smollm2());
    let draft = common::load_cpu(&QWEN2_F32.write(), CONTEXT);
    g.set_speculation(SpeculativeOptions { lookup: false, draft_max: 3, p_min: 0.0 }, Some(draft)).expect("draft model");
    let stats = assert_as_plain(&mut g, &prompt, &options).speculative.expect("speculated");
    assert!(stats.drafted > stats.accepted, "random drafts fall: {stats:?}");
}

#[test]
fn batched_sequences_each_speculate_and_give_their_plain_tokens() {
    let mut g = Generator::new(smollm2());
    g.set_slots(4).expect("slots");
    let edit = edit_prompt(&g);
    let greedy = |max_tokens| GenerateOptions { max_tokens, ignore_eos: true, ..GenerateOptions::greedy() };
    let requests = vec![
        (edit.clone(), greedy(40)),
        (common::bench_ids(12), GenerateOptions { logprobs: 2, ..greedy(20) }),
        (edit[..edit.len() - 3].to_vec(), greedy(30)),
    ];
    let alone = common::generate_alone(&mut g, &requests);
    g.set_speculation(lookup(), None).expect("lookup");
    let batched = common::run_batched(&mut g, &requests, 16);
    for ((_, b), a) in batched.iter().zip(&alone) {
        assert_eq!(b.tokens, a.tokens);
        assert_eq!(b.logprobs, a.logprobs);
    }
    assert!(batched.iter().any(|(_, b)| b.speculative.is_some_and(|s| s.accepted > 0)), "lookup drafts stood in the batch");
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused_naming_the_first_differing_id() {
    let target = smollm2();
    let other = common::load_cpu(&common::repo_root().join("models/gemma-3-270m-q4_k_m.gguf"), CONTEXT);
    let mut g = Generator::new(target);
    let err = g.set_speculation(SpeculativeOptions::default(), Some(other)).expect_err("another vocabulary");
    assert_eq!(err.code(), "invalid_option");
    assert!(err.to_string().contains("token id "), "{err}");
    assert!(g.speculation().is_none());
}

/// Plain greedy decoding's top-2 log-probability margin under which the GPU's verification
/// (prefill kernels) may choose the other token than its decode kernels.
const GPU_NEAR_TIE: f32 = 0.02;

/// The same request plainly and speculatively on the GPU: the tokens agree up to where they part
/// (if they do), and there plain decoding's top-2 margin is under `GPU_NEAR_TIE`.
fn assert_as_plain_up_to_a_near_tie(g: &mut Generator, prompt: &[u32], options: &GenerateOptions) -> Generation {
    let plain = generate(g, prompt, &GenerateOptions { speculative: false, logprobs: 2, ..options.clone() });
    let spec = generate(g, prompt, options);
    let parted = plain.tokens.iter().zip(&spec.tokens).position(|(a, b)| a != b);
    match parted {
        None => assert_eq!(spec.tokens.len(), plain.tokens.len(), "the same tokens, and as many"),
        Some(j) => {
            let top = &plain.logprobs[j].top;
            let margin = top[0].1 - top[1].1;
            eprintln!("GPU: speculative and plain tokens part at step {j}, where plain decoding's top-2 margin is {margin:.4}");
            assert!(margin < GPU_NEAR_TIE, "they part at step {j}, with a margin of {margin}");
        }
    }
    spec
}

#[test]
fn on_the_gpu_lookup_and_a_draft_model_give_plain_greedy_tokens() {
    let mut g = Generator::new(common::load(&common::default_model_path(), CONTEXT));
    g.set_speculation(lookup(), None).expect("lookup on the GPU");
    let prompt = edit_prompt(&g);
    let options = GenerateOptions { max_tokens: 40, ..GenerateOptions::greedy() };
    let stats = assert_as_plain_up_to_a_near_tie(&mut g, &prompt, &options).speculative.expect("speculated");
    eprintln!("GPU lookup: {stats:?}");
    assert!(stats.drafted > 0, "lookup drafted: {stats:?}");

    let mut g = Generator::new(common::load(&common::default_model_path(), CONTEXT));
    let draft = common::load(&common::default_model_path(), CONTEXT);
    g.set_speculation(SpeculativeOptions { lookup: false, draft_max: 4, p_min: 0.0 }, Some(draft)).expect("a draft model on the GPU");
    let options = GenerateOptions { max_tokens: 24, ignore_eos: true, ..GenerateOptions::greedy() };
    let stats = assert_as_plain_up_to_a_near_tie(&mut g, &common::bench_ids(24), &options).speculative.expect("speculated");
    eprintln!("GPU draft model: {stats:?}");
    assert!(stats.accepted > 0, "the model's own drafts stand: {stats:?}");
}

/// 99.9th percentiles of chi-square, by degrees of freedom (1 to 16).
const CHI2_999: [f64; 16] =
    [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25];

#[test]
fn sampled_tokens_verified_against_a_draft_model_are_distributed_as_the_target() {
    let target = common::load_cpu(&QWEN2_F32.write(), 64);
    // The same weights in Q8_0: a draft close to the target, so that both verdicts occur.
    let draft = common::load_cpu(&QWEN2_Q8_0.write(), 64);
    let mut g = Generator::new(target);
    // Top-4 at temperature 1: each token has 4 outcomes, the pair 16.
    let base = GenerateOptions {
        max_tokens: 3,
        temperature: 1.0,
        top_k: 4,
        top_p: 1.0,
        min_p: 0.0,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let params = SamplingParams { temperature: 1.0, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 };
    let prompt = common::bench_ids(6);
    // The target's own distribution of the first token, then of the second after each first.
    let model = g.model_mut().expect("idle");
    let (first_ids, first_p) = distribution(&pollster::block_on(model.prompt_logits(&prompt)).expect("logits"), &params);
    let mut expected: Vec<((u32, u32), f64)> = Vec::new();
    for (&t1, &p1) in first_ids.iter().zip(&first_p) {
        let with_first: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        let (ids, p) = distribution(&pollster::block_on(model.prompt_logits(&with_first)).expect("logits"), &params);
        expected.extend(ids.iter().zip(&p).map(|(&t2, &p2)| ((t1, t2), f64::from(p1) * f64::from(p2))));
    }
    g.set_speculation(SpeculativeOptions { lookup: false, draft_max: 2, p_min: 0.0 }, Some(draft)).expect("draft model");
    let runs = 2000u64;
    let mut counts = vec![0u64; expected.len()];
    let mut stats = kestrel_engine::generation::speculation::SpeculativeStats::default();
    for seed in 0..runs {
        let options = GenerateOptions { seed: Some(seed), ..base.clone() };
        let out = pollster::block_on(g.generate(&prompt, &options, &mut |_| true)).expect("generate");
        stats.add(&out.speculative.expect("speculated"));
        let pair = (out.tokens[0], out.tokens[1]);
        let cell = expected.iter().position(|(p, _)| *p == pair).unwrap_or_else(|| panic!("{pair:?} outside the target's top-4s"));
        counts[cell] += 1;
    }
    assert!(stats.accepted > 0 && stats.accepted < stats.drafted, "both verdicts occur: {stats:?}");
    // Cells expecting under 5 draws are pooled, as the test's approximation needs.
    let (mut chi2, mut cells, mut pooled_count, mut pooled_p) = (0.0, 0, 0u64, 0.0);
    for ((_, p), &c) in expected.iter().zip(&counts) {
        let e = p * runs as f64;
        if e < 5.0 {
            pooled_count += c;
            pooled_p += p;
        } else {
            chi2 += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_p * runs as f64 >= 5.0 {
        let e = pooled_p * runs as f64;
        chi2 += (pooled_count as f64 - e).powi(2) / e;
        cells += 1;
    }
    let df = cells - 1;
    eprintln!("chi-square {chi2:.2} over {cells} cells ({stats:?})");
    assert!(chi2 < CHI2_999[df - 1], "chi-square {chi2:.2} with {df} degrees of freedom over {counts:?}");
}
