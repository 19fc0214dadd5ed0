//! Constrained decoding: output held to a JSON Schema (OpenAI's `response_format`), any JSON
//! object, a regular expression or a Lark grammar, by masking every token the constraint does
//! not allow before the sampler draws. The masks come from llguidance (the engine vLLM, SGLang and
//! llama.cpp use), over a token trie built once per model from the model's own vocabulary.
//!
//! The request's wire fields (`response_format`, `regex`, `grammar`) are [`OutputConstraint`]s;
//! a model compiles one into a [`TokenMatcher`] before any token runs, so a bad schema, regex or
//! grammar is an `invalid_option` error naming it. llguidance's limits bound the work of
//! compiling and of every mask, so a schema built to explode fails instead of hanging.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use kestrel_ops::reference::sample::apply_token_mask;
use kestrel_tokenizer::Tokenizer;

use kestrel_model::ModelError;

/// OpenAI's `response_format`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text: no constraint.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`: OpenAI's shape. `strict` is accepted and always holds: the
/// output is constrained to the schema whatever it says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// No schema: any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// What a request's output is held to: one of its `response_format`, `regex` and `grammar`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutputConstraint<'a> {
    JsonObject,
    JsonSchema(&'a JsonSchemaFormat),
    /// A regular expression (Rust's `regex` syntax) the whole output matches.
    Regex(&'a str),
    /// A grammar in llguidance's Lark syntax.
    Grammar(&'a str),
    /// The Lark grammar of a request's tool calls (tools.rs).
    ToolCalls(&'a str),
}

impl OutputConstraint<'_> {
    /// The request field it came from, as errors name it.
    pub fn field(self) -> &'static str {
        match self {
            Self::JsonObject | Self::JsonSchema(_) => "response_format",
            Self::Regex(_) => "regex",
            Self::Grammar(_) => "grammar",
            Self::ToolCalls(_) => "tools",
        }
    }

    /// llguidance's grammar for it. Between JSON tokens a model may put one space, or a line
    /// break or two and an indent of up to 20 (llama.cpp's JSON grammars allow the same): enough
    /// to pretty-print, too little to spend its tokens on blank space. A schema's own
    /// `x-guidance` options override that.
    fn grammar(self) -> TopLevelGrammar {
        let compact = || json!({ "whitespace_pattern": JSON_WHITESPACE });
        match self {
            Self::JsonObject => TopLevelGrammar::from_json_schema(json!({ "type": "object", "x-guidance": compact() })),
            Self::JsonSchema(format) => {
                // `true` is the schema that takes any value, as `{}` is (which can take options).
                let mut schema = match &format.schema {
                    None | Some(Value::Bool(true)) => json!({}),
                    Some(schema) => schema.clone(),
                };
                if let Some(fields) = schema.as_object_mut() {
                    fields.entry("x-guidance").or_insert_with(compact);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Self::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Self::Grammar(lark) | Self::ToolCalls(lark) => TopLevelGrammar::from_lark(lark.to_string()),
        }
    }
}

/// The whitespace allowed between two JSON tokens, at most once.
pub(crate) const JSON_WHITESPACE: &str = r"(?:\x20|\n{1,2}[\x20\x09]{0,20})";

/// Per model: its vocabulary as llguidance's token trie, and the grammar compiler over it.
pub struct TokenGrammar {
    factory: ParserFactory,
    /// The token that ends a constrained output: the model's end of turn, else its EOS.
    end: u32,
}

impl TokenGrammar {
    /// Builds the trie of a model with `vocab` logits. Control and end-of-generation tokens
    /// (`<|im_end|>`, Gemma's user-defined `</s>`, ...) are marked as special, so that no grammar
    /// spells one out of its text and ends the output early; ids past the
    /// tokenizer's vocabulary (padding) have no bytes and are never allowed.
    /// `field`: the request field that asked for it, which an error names.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, field: &'static str) -> Result<Self, ModelError> {
        let unusable = |reason: String| ModelError::InvalidOption { name: field, reason };
        let end = tokenizer
            .eot_id()
            .or(tokenizer.eos_id())
            .ok_or_else(|| unusable("the model has no end-of-text token to end a constrained output with".into()))?;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| match tokenizer.token_bytes(id) {
                Ok(bytes) if tokenizer.is_control(id) || tokenizer.is_eog(id) || id == end => {
                    [&[TokTrie::SPECIAL_TOKEN_MARKER][..], bytes].concat()
                }
                Ok(bytes) => bytes.to_vec(),
                Err(_) => Vec::new(),
            })
            .collect();
        let vocab_size = u32::try_from(vocab).map_err(|_| unusable(format!("a vocabulary of {vocab} tokens")))?;
        let info = TokRxInfo { tok_end_of_turn: tokenizer.eot_id(), ..TokRxInfo::new(vocab_size, end) };
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unusable(format!("the vocabulary's token trie: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self { factory, end })
    }

    /// A matcher for one output: the constraint compiled, or `invalid_option` naming its field
    /// and what is wrong with it.
    pub fn matcher(&self, constraint: OutputConstraint<'_>) -> Result<TokenMatcher, ModelError> {
        let parser = self.factory.create_parser(constraint.grammar());
        let matcher = Matcher::new(parser);
        if let Some(error) = matcher.get_error() {
            return Err(ModelError::InvalidOption { name: constraint.field(), reason: one_line(&error) });
        }
        Ok(TokenMatcher { matcher, end: self.end, field: constraint.field(), next: None })
    }
}

/// The bounds on a constraint's work: llguidance's defaults, but the grammar size and the lexer
/// states at 40% of theirs, where a browser tab's memory is at stake. Each mask stays within a
/// few milliseconds of work (the fuel and item counts, at the speeds llguidance states); a
/// grammar's size and its lexer's states bound the
/// memory a hostile schema can take.
fn limits() -> ParserLimits {
    ParserLimits { max_grammar_size: 200_000, max_lexer_states: 100_000, verbose_errors: false, ..ParserLimits::default() }
}

/// Longest error text taken from llguidance, whose errors may quote a whole grammar.
const MAX_ERROR_CHARS: usize = 300;

/// An llguidance error on one line (a regex error points at the place on lines of its own), cut
/// to `MAX_ERROR_CHARS`.
fn one_line(error: &str) -> String {
    let line = error.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

/// One output's constraint, step by step: the tokens allowed next, then the token chosen.
pub struct TokenMatcher {
    matcher: Matcher,
    end: u32,
    field: &'static str,
    /// The tokens allowed next, once computed (`prepare`).
    next: Option<SimpleVob>,
}

impl TokenMatcher {
    /// Computes the tokens allowed next: called while the device runs the step whose logits they
    /// mask, so that the host's work overlaps the device's.
    pub fn prepare(&mut self) -> Result<(), ModelError> {
        if self.next.is_none() {
            let allowed = self.matcher.compute_mask_or_eos().map_err(|e| self.failed(&e.to_string()))?;
            if allowed.is_zero() {
                return Err(self.failed("no token can continue the output"));
            }
            self.next = Some(allowed);
        }
        Ok(())
    }

    /// Sets the logit of every token the constraint does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ModelError> {
        self.prepare()?;
        if let Some(allowed) = &self.next {
            apply_token_mask(allowed.as_slice(), logits);
        }
        Ok(())
    }

    /// The tokens allowed next as a bitmask of `words` u32 words (bit `id % 32` of word
    /// `id / 32`), for the GPU's mask kernel: ids past the vocabulary are clear.
    pub fn mask_words(&mut self, words: usize) -> Result<Vec<u32>, ModelError> {
        self.prepare()?;
        let mut out = vec![0u32; words];
        if let Some(allowed) = &self.next {
            for (o, &w) in out.iter_mut().zip(allowed.as_slice()) {
                *o = w;
            }
        }
        Ok(out)
    }

    /// Whether `token` is the one that ends the output (allowed once the output is complete).
    pub fn is_end(&self, token: u32) -> bool {
        token == self.end
    }

    /// Takes the token chosen (not the end token); true when nothing can follow the tokens so
    /// far, so the output is complete.
    pub fn accept(&mut self, token: u32) -> Result<bool, ModelError> {
        self.next = None;
        self.matcher.consume_token(token).map_err(|e| self.failed(&e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }

    /// Of `tokens`, how many from the first the constraint allows in a row (a lookup draft is cut
    /// there). The matcher's state does not change.
    pub fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize, ModelError> {
        self.matcher.validate_tokens(tokens).map_err(|e| self.failed(&e.to_string()))
    }

    /// Takes a drafted token for now, so that the draft's next token is masked as the output
    /// after it; false (and nothing taken) where the constraint does not allow it.
    /// `forget_draft` takes the drafted tokens back.
    pub fn draft(&mut self, token: u32) -> Result<bool, ModelError> {
        self.next = None;
        let taken = self.matcher.try_consume_tokens(&[token]).map_err(|e| self.failed(&e.to_string()))?;
        Ok(taken == 1)
    }

    /// Takes back the last `n` drafted tokens (`draft`).
    pub fn forget_draft(&mut self, n: usize) -> Result<(), ModelError> {
        self.next = None;
        if n > 0 {
            self.matcher.rollback(n).map_err(|e| self.failed(&e.to_string()))?;
        }
        Ok(())
    }

    fn failed(&self, why: &str) -> ModelError {
        let reason = self.matcher.get_error().map_or_else(|| one_line(why), |e| one_line(&e));
        ModelError::InvalidOption { name: self.field, reason: format!("the constraint failed: {reason}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-at-a-time ban keeps exactly the tokens llguidance's mask allows: whole words of
    /// none and of all, mixed words, and a vocabulary that ends inside a word.
    #[test]
    fn the_token_mask_keeps_exactly_the_allowed_tokens() {
        let vocab = 32 * 5 + 7;
        let mut allowed = SimpleVob::alloc(vocab);
        let kept: Vec<usize> = (32..64).chain([3, 70, 101, 164, vocab - 1]).collect();
        for &id in &kept {
            allowed.allow_token(id as u32);
        }
        let mut logits: Vec<f32> = (0..vocab).map(|i| i as f32).collect();
        apply_token_mask(allowed.as_slice(), &mut logits);
        for (id, &logit) in logits.iter().enumerate() {
            let want = if kept.contains(&id) { id as f32 } else { f32::NEG_INFINITY };
            assert_eq!(logit, want, "token {id}");
        }
    }
}
