//! Compiles an arbitrary constraint over the default model's vocabulary, and runs what compiles
//! for a few steps: each step masks the logits and takes one of the tokens it allows (picked by
//! the input's last bytes). The input's first byte picks the kind: 0x01, the rest is a `regex`;
//! 0x02, the rest is a Lark `grammar`; anything else, the whole input is JSON taken as a
//! `response_format` JSON Schema.
//!
//! Seeds: the schemas of tests/data/constrained/schemas.json, one per file, and a few regexes and
//! grammars (fuzz/seeds/constraint).
//!
//! Asserted: compiling gives a matcher or an `invalid_option` error naming the constraint's field;
//! every step gives a mask that allows at least one token, or such an error; nothing panics,
//! hangs or overflows the stack (llguidance's limits bound the work; serde_json bounds the depth).
#![no_main]

use std::sync::OnceLock;

use kestrel_engine::generation::{JsonSchemaFormat, OutputConstraint, TokenGrammar};
use kestrel_model::ModelError;
use libfuzzer_sys::fuzz_target;

/// Steps run per input that compiles.
const STEPS: usize = 12;

fn grammar() -> &'static TokenGrammar {
    static GRAMMAR: OnceLock<TokenGrammar> = OnceLock::new();
    GRAMMAR.get_or_init(|| {
        let tokenizer = kestrel_fuzz::tokenizer();
        TokenGrammar::new(tokenizer, tokenizer.vocab_size(), "response_format").expect("the default model's token trie")
    })
}

fn assert_coded(e: &ModelError, field: &str) {
    assert!(matches!(e, ModelError::InvalidOption { name, .. } if *name == field), "{e:?}");
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    let format;
    let text;
    let constraint = match data.split_first() {
        Some((1, rest)) => {
            let Ok(regex) = std::str::from_utf8(rest) else { return };
            text = regex.to_string();
            OutputConstraint::Regex(&text)
        }
        Some((2, rest)) => {
            let Ok(lark) = std::str::from_utf8(rest) else { return };
            text = lark.to_string();
            OutputConstraint::Grammar(&text)
        }
        _ => {
            let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else { return };
            format = JsonSchemaFormat { name: "fuzz".into(), description: None, schema: Some(schema), strict: None };
            OutputConstraint::JsonSchema(&format)
        }
    };
    let field = constraint.field();
    let mut matcher = match grammar().matcher(constraint) {
        Ok(m) => m,
        Err(e) => return assert_coded(&e, field),
    };
    let vocab = kestrel_fuzz::tokenizer().vocab_size();
    for step in 0..STEPS {
        let mut logits = vec![0f32; vocab];
        if let Err(e) = matcher.mask(&mut logits) {
            return assert_coded(&e, field);
        }
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&id| logits[id as usize] == 0.0).collect();
        assert!(!allowed.is_empty(), "a mask that allows nothing");
        let byte = data.len().checked_sub(step + 1).and_then(|i| data.get(i)).copied().unwrap_or(0);
        let token = allowed[byte as usize * 7919 % allowed.len()];
        if matcher.is_end(token) {
            return;
        }
        match matcher.accept(token) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => return assert_coded(&e, field),
        }
    }
});
