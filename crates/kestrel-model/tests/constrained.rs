//! Constrained outputs (`response_format`, `regex`, `grammar`): every output of the schema suite
//! (tests/data/constrained/schemas.json, 20 schemas of the kinds structured output takes) parses
//! and validates against its schema, checked by the `jsonschema` crate, greedy and sampled at
//! temperature 1 with several seeds, on the CPU backend, on the GPU backend and in batches; a
//! constraint that the model's own output already meets changes none of its tokens; and a bad
//! schema, regex or grammar fails as `invalid_option` before any token.

mod common;

use kestrel_engine::generation::{FinishReason, GenerateOptions, Generation, Generator, JsonSchemaFormat, Prompt, ResponseFormat};
use kestrel_model::{ChatMessage, ModelError};
use serde_json::Value;

/// Enough for every schema of the suite, whose strings, arrays and numbers are bounded.
const MAX_TOKENS: usize = 256;

/// Seeds of the sampled runs (temperature 1).
const SEEDS: [u64; 3] = [1, 2, 3];

struct Case {
    id: String,
    ask: String,
    schema: Value,
}

fn suite() -> Vec<Case> {
    let path = common::repo_root().join("tests/data/constrained/schemas.json");
    let file: Value = serde_json::from_slice(&std::fs::read(&path).expect("schemas.json")).expect("schemas.json is JSON");
    file["schemas"]
        .as_array()
        .expect("schemas")
        .iter()
        .map(|c| Case {
            id: c["id"].as_str().expect("id").into(),
            ask: c["ask"].as_str().expect("ask").into(),
            schema: c["schema"].clone(),
        })
        .collect()
}

fn schema_options(case: &Case, base: GenerateOptions) -> GenerateOptions {
    let json_schema = JsonSchemaFormat { name: case.id.clone(), description: None, schema: Some(case.schema.clone()), strict: Some(true) };
    GenerateOptions { max_tokens: MAX_TOKENS, response_format: Some(ResponseFormat::JsonSchema { json_schema }), ..base }
}

fn prompt_ids(model: &Generator, ask: &str) -> Vec<u32> {
    let messages = [ChatMessage::new("system", "Answer in JSON."), ChatMessage::new("user", ask)];
    model.encode(&Prompt::Chat(&messages)).expect("encode")
}

fn generate(model: &mut Generator, prompt: &[u32], options: &GenerateOptions) -> Result<Generation, ModelError> {
    pollster::block_on(model.generate(prompt, options, &mut |_| true))
}

/// The output ended by its constraint (not cut by `max_tokens`), parses, and is valid.
fn assert_valid(case: &Case, generation: &Generation, run: &str) {
    let what = format!("{} ({run}): {:?}", case.id, generation.text);
    assert_eq!(generation.finish_reason, FinishReason::Stop, "{what}: not complete within {MAX_TOKENS} tokens");
    let value: Value = serde_json::from_str(&generation.text).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"));
    let validator = jsonschema::validator_for(&case.schema).unwrap_or_else(|e| panic!("{}: the schema itself: {e}", case.id));
    let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: invalid against its schema: {}", errors.join("; "));
}

fn runs() -> Vec<(String, GenerateOptions)> {
    let sampled = |seed| GenerateOptions { temperature: 1.0, seed: Some(seed), ..GenerateOptions::default() };
    std::iter::once(("greedy".to_string(), GenerateOptions::greedy())).chain(SEEDS.map(|s| (format!("seed {s}"), sampled(s)))).collect()
}

#[test]
fn every_output_of_the_schema_suite_validates_on_the_cpu_backend() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let mut tokens = 0;
    for case in suite() {
        let prompt = prompt_ids(&model, &case.ask);
        for (run, base) in runs() {
            let generation = generate(&mut model, &prompt, &schema_options(&case, base)).expect("generate");
            eprintln!("{} ({run}): {}", case.id, generation.text);
            tokens += generation.tokens.len();
            assert_valid(&case, &generation, &run);
        }
    }
    eprintln!("{tokens} tokens in all");
}

/// The GPU path chooses a constrained token on the host from the step's logits: a few schemas
/// of each kind, greedy and sampled.
#[test]
fn schema_outputs_validate_on_the_gpu_backend() {
    let mut model = Generator::new(common::load(&common::default_model_path(), 1024));
    let cases = suite();
    let picked = ["nested_address", "any_of", "refs", "array_of_objects"];
    for case in cases.iter().filter(|c| picked.contains(&c.id.as_str())) {
        let prompt = prompt_ids(&model, &case.ask);
        for (run, base) in runs().into_iter().take(2) {
            let generation = generate(&mut model, &prompt, &schema_options(case, base.clone())).expect("generate");
            eprintln!("{} ({run}): {}", case.id, generation.text);
            assert_valid(case, &generation, &run);
            if base.is_greedy() {
                // The device applies the uploaded mask and samples; with logprobs the logits come
                // back and the host masks and samples. The same logits, the same greedy tokens.
                let host = generate(&mut model, &prompt, &schema_options(case, GenerateOptions { logprobs: 1, ..base })).expect("generate");
                assert_eq!(host.tokens, generation.tokens, "{}: the device's mask and the host's", case.id);
            }
        }
    }
}

/// A regular expression of exactly the characters the model's unconstrained greedy text uses:
/// a real constraint (every token with another character is banned) that the text meets, so no
/// token may change.
#[test]
fn a_constraint_the_output_already_meets_changes_no_token() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let prompt = model.encode(&Prompt::Text("The three primary colors are")).expect("encode");
    let free = generate(&mut model, &prompt, &GenerateOptions { max_tokens: 24, ..GenerateOptions::greedy() }).expect("free");
    let mut chars: Vec<char> = free.text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let class: String = chars.iter().map(|c| format!("\\u{{{:x}}}", *c as u32)).collect();
    let regex = format!("[{class}]*");
    let options = GenerateOptions { max_tokens: 24, regex: Some(regex.clone()), ..GenerateOptions::greedy() };
    let held = generate(&mut model, &prompt, &options).expect("constrained");
    assert!(chars.len() < 40, "{regex}: the text uses too many characters to constrain anything");
    assert_eq!(held.tokens, free.tokens, "{regex}: {:?} against {:?}", held.text, free.text);
    assert_eq!(held.finish_reason, free.finish_reason);
}

/// Constraints work with the other options: a cut-off output says `length`, a stop string still
/// stops it, logprobs come from the model's own distribution, and batched sequences each keep
/// their own matcher and give what they give alone.
#[test]
fn constraints_work_with_max_tokens_stop_logprobs_and_batching() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let cases = suite();
    let person = cases.iter().find(|c| c.id == "person").expect("person");
    let prompt = prompt_ids(&model, &person.ask);

    let cut = generate(&mut model, &prompt, &GenerateOptions { max_tokens: 4, ..schema_options(person, GenerateOptions::greedy()) })
        .expect("cut");
    assert_eq!((cut.finish_reason, cut.tokens.len()), (FinishReason::Length, 4), "{:?}", cut.text);
    let whole = generate(&mut model, &prompt, &schema_options(person, GenerateOptions::greedy())).expect("whole");
    assert_valid(person, &whole, "greedy");
    assert!(whole.text.starts_with(&cut.text), "{:?} is not the start of {:?}", cut.text, whole.text);

    let stopped =
        generate(&mut model, &prompt, &GenerateOptions { stop: vec!["age".into()], ..schema_options(person, GenerateOptions::greedy()) })
            .expect("stop");
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert!(whole.text.contains("age") && !stopped.text.contains("age") && whole.text.starts_with(&stopped.text), "{:?}", stopped.text);

    let with_logprobs =
        generate(&mut model, &prompt, &GenerateOptions { logprobs: 3, ..schema_options(person, GenerateOptions::greedy()) })
            .expect("logprobs");
    assert_eq!(with_logprobs.tokens, whole.tokens);
    assert_eq!(with_logprobs.logprobs.len(), whole.tokens.len());
    for (step, &token) in with_logprobs.logprobs.iter().zip(&with_logprobs.tokens) {
        assert_eq!(step.token, token);
        assert!(step.logprob <= 0.0 && step.top.len() == 3, "{step:?}");
    }
    // The model's own distribution, not the masked one: the first step's top 3 are the
    // unconstrained first step's.
    let free = generate(&mut model, &prompt, &GenerateOptions { max_tokens: 1, logprobs: 3, ..GenerateOptions::greedy() }).expect("free");
    assert_eq!(with_logprobs.logprobs[0].top, free.logprobs[0].top);

    model.set_slots(4).expect("slots");
    let sampled = GenerateOptions { temperature: 1.0, seed: Some(7), ..GenerateOptions::default() };
    let by_id = |id: &str| cases.iter().find(|c| c.id == id).expect("case");
    let requests: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (prompt.clone(), schema_options(person, GenerateOptions::greedy())),
        (prompt_ids(&model, &by_id("refs").ask), schema_options(by_id("refs"), sampled.clone())),
        (prompt.clone(), GenerateOptions { max_tokens: 12, ..GenerateOptions::greedy() }),
        (prompt_ids(&model, "A phone number?"), GenerateOptions { regex: Some("[0-9]{3}-[0-9]{4}".into()), ..sampled }),
    ];
    let alone = common::generate_alone(&mut model, &requests);
    assert!(alone[3].text.len() == 8 && alone[3].finish_reason == FinishReason::Stop, "{:?}", alone[3].text);
    common::assert_batched_as_alone(&mut model, &requests, &alone, 16);
}

/// A bad constraint is `invalid_option` naming its field, before any token, and the model serves
/// the next request. So is a schema built to explode: llguidance's limits stop it.
#[test]
fn bad_constraints_fail_before_any_token() {
    let mut model = Generator::new(common::load_cpu(&common::default_model_path(), 1024));
    let prompt = model.encode(&Prompt::Text("Hello")).expect("encode");
    let schema = |schema: Value| GenerateOptions {
        response_format: Some(ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat { name: "bad".into(), description: None, schema: Some(schema), strict: None },
        }),
        ..GenerateOptions::greedy()
    };
    // As deep as a request's JSON can be: serde_json refuses to parse past 128 levels.
    let deep: Value =
        serde_json::from_str(&format!("{}{{\"type\":\"integer\"}}{}", "{\"type\":\"array\",\"items\":".repeat(126), "}".repeat(126)))
            .expect("a schema 127 levels deep");
    let huge_enum: Vec<String> = (0..200_000).map(|i| format!("value number {i}")).collect();
    let cases: Vec<(&str, GenerateOptions)> = vec![
        ("response_format", schema(serde_json::json!({ "type": "objekt" }))),
        ("response_format", schema(serde_json::json!({ "type": "array", "uniqueItems": true }))),
        ("response_format", schema(serde_json::json!({ "$ref": "#/$defs/missing" }))),
        ("regex", GenerateOptions { regex: Some("[a-".into()), ..GenerateOptions::greedy() }),
        ("grammar", GenerateOptions { grammar: Some("start: missing_rule".into()), ..GenerateOptions::greedy() }),
        ("grammar", GenerateOptions { regex: Some("a".into()), grammar: Some("start: \"a\"".into()), ..GenerateOptions::greedy() }),
    ];
    for (field, options) in cases {
        let cached = model.model().cached_token_ids().to_vec();
        let mut tokens = 0;
        let error = pollster::block_on(model.generate(&prompt, &options, &mut |_| {
            tokens += 1;
            true
        }))
        .expect_err("a bad constraint");
        eprintln!("{field}: {error}");
        assert!(matches!(error, ModelError::InvalidOption { name, .. } if name == field), "{field}: {error:?}");
        assert_eq!(tokens, 0, "{field}: tokens before the error");
        assert_eq!(model.model().cached_token_ids(), cached, "{field}: the cached prefix stays for the next request");
        let fine =
            generate(&mut model, &prompt, &GenerateOptions { max_tokens: 3, ..GenerateOptions::greedy() }).expect("the next request");
        assert_eq!(fine.tokens.len(), 3);
    }
    // Built to explode: each either runs (to its end or its 8 tokens) or is refused, within
    // llguidance's limits, and never hangs or crashes.
    let explosive: Vec<(&str, GenerateOptions)> = vec![
        ("a schema 127 levels deep", schema(deep)),
        ("an enum of 200,000 strings", schema(serde_json::json!({ "enum": huge_enum }))),
        ("a regex of a million states", GenerateOptions { regex: Some("(a{1000}){1000}".into()), ..GenerateOptions::greedy() }),
        ("a regex of nested stars", GenerateOptions { regex: Some("((a*)*b*)*(a|aa|aaa)*c".into()), ..GenerateOptions::greedy() }),
    ];
    for (what, options) in explosive {
        let options = GenerateOptions { max_tokens: 8, ..options };
        match generate(&mut model, &prompt, &options) {
            Ok(g) => {
                eprintln!("{what}: ran, {:?}", g.text);
                assert!(!g.tokens.is_empty() && g.tokens.len() <= 8, "{what}: {g:?}");
                assert!(g.finish_reason == FinishReason::Length || g.finish_reason == FinishReason::Stop, "{what}: {g:?}");
            }
            Err(e) => {
                eprintln!("{what}: {e}");
                assert_eq!(e.code(), "invalid_option", "{what}: {e:?}");
            }
        }
    }
}
