//! Generation ends where llama.cpp's ends, on the real Gemma 3 270M file
//! (scripts/fetch-gemma3.sh): its end-of-generation set is llama.cpp's (which adds `</s>`, a
//! user-defined token in the file, to `<eos>` and `<end_of_turn>`), and a prompt whose greedy
//! continuation is `</s>` (tests/data/reference-gemma3-270m, tags_eog) ends there, on either
//! backend, with the tokens llama.cpp generated before it.

mod common;

use kestrel_engine::generation::{FinishReason, GenerateOptions, Generator};
use kestrel_model::BackendKind;

#[test]
fn generation_stops_at_llama_cpp_end_of_generation_tokens() {
    let path = common::repo_root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-gemma3.sh", path.display());
    let reference = common::greedy_reference_in("reference-gemma3-270m");
    let eog = common::ids(&reference["tokenizer"]["eog_ids"]);
    let cases: Vec<_> = reference["prompts"].as_array().expect("prompts").iter().filter(|c| c["first_eog_index"].is_u64()).collect();
    assert!(!cases.is_empty(), "no reference prompt ends with an end-of-generation token");
    for on in [BackendKind::Cpu, BackendKind::Gpu] {
        let mut model = Generator::new(match on {
            BackendKind::Gpu => common::load(&path, 256),
            BackendKind::Cpu => common::load_cpu(&path, 256),
        });
        assert_eq!(model.model().tokenizer().eog_ids(), eog, "the end-of-generation set differs from llama.cpp's");
        for case in &cases {
            let id = case["id"].as_str().expect("id");
            let end = case["first_eog_index"].as_u64().expect("first_eog_index") as usize;
            let want = &common::ids(&case["greedy_ids"])[..end];
            let prompt = common::ids(&case["prompt_ids"]);
            let options = GenerateOptions { max_tokens: 32, ..GenerateOptions::greedy() };
            let generation = pollster::block_on(model.generate(&prompt, &options, &mut |_| true)).expect("generate");
            assert_eq!(generation.tokens, want, "{} {id}: the tokens before llama.cpp's end", on.as_str());
            assert_eq!(generation.finish_reason, FinishReason::Stop, "{} {id}: not ended by the end token", on.as_str());
        }
    }
}
