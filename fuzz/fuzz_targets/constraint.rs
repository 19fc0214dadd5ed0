//! Compiles arbitrary JSON as a request's JSON Schema (`response_format`) over the default
//! model's vocabulary, and runs what compiles for a few steps: each step masks the logits and
//! takes one of the tokens it allows (picked by the input's own bytes).
//!
//! Seeds: the schemas of tests/data/constrained/schemas.json, one per file (fuzz/seeds/constraint).
//!
//! Asserted: compiling gives a matcher or an `invalid_option` error naming `response_format`;
//! every step gives a mask that allows at least one token, or such an error; nothing panics,
//! hangs or overflows the stack (llguidance's limits bound the work; serde_json bounds the depth).
#![no_main]

use std::sync::OnceLock;

use kestrel_model::{JsonSchemaFormat, ModelError, OutputConstraint, TokenGrammar};
use libfuzzer_sys::fuzz_target;

/// Steps run per input that compiles.
const STEPS: usize = 12;

fn grammar() -> &'static TokenGrammar {
    static GRAMMAR: OnceLock<TokenGrammar> = OnceLock::new();
    GRAMMAR.get_or_init(|| {
        let tokenizer = kestrel_fuzz::tokenizer();
        TokenGrammar::new(tokenizer, tokenizer.vocab_size()).expect("the default model's token trie")
    })
}

fn assert_coded(e: &ModelError) {
    assert!(matches!(e, ModelError::InvalidOption { name: "response_format", .. }), "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let format = JsonSchemaFormat { name: "fuzz".into(), description: None, schema: Some(schema), strict: None };
    let mut matcher = match grammar().matcher(OutputConstraint::JsonSchema(&format)) {
        Ok(m) => m,
        Err(e) => return assert_coded(&e),
    };
    let vocab = kestrel_fuzz::tokenizer().vocab_size();
    for step in 0..STEPS {
        let mut logits = vec![0f32; vocab];
        if let Err(e) = matcher.mask(&mut logits) {
            return assert_coded(&e);
        }
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&id| logits[id as usize] == 0.0).collect();
        assert!(!allowed.is_empty(), "a mask that allows nothing");
        let pick = data.get(step).copied().unwrap_or(0) as usize * 7919 % allowed.len();
        let token = allowed[pick];
        if matcher.is_end(token) {
            return;
        }
        match matcher.accept(token) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => return assert_coded(&e),
        }
    }
});
