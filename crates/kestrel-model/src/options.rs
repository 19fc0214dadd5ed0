//! Generation options, as OpenAI-style APIs name them, with their validation. Every option out
//! of range is an error naming the option and the allowed range.
//!
//! This type is also the wire format: it (de)serializes with serde under the names the browser
//! package sends (`max_tokens`, `stop` as a string or an array, `logit_bias` as a
//! `{"token id": bias}` object, ...), and absent fields take [`GenerateOptions::default`].

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::constraint::{OutputConstraint, ResponseFormat};
use crate::tools::{Tool, ToolChoice};
use crate::ModelError;

/// Longest recent-token window the penalties look at (`penalty_last_n`).
pub const MAX_PENALTY_WINDOW: usize = 4096;
/// Most `logit_bias` entries one request may give. The GPU penalty buffer holds the window and
/// the bias list: `MAX_PENALTY_WINDOW + MAX_LOGIT_BIAS` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most top log-probabilities reported per step (`logprobs`), as OpenAI's API allows.
pub const MAX_LOGPROBS: usize = 20;
/// Most stop strings one request may give (each is searched for after every token).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in UTF-8 bytes.
pub const MAX_STOP_BYTES: usize = 512;
/// Most stop token ids one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// 1 disables top-p.
    pub top_p: f32,
    /// 0 disables min-p.
    pub min_p: f32,
    /// 1 disables the repetition penalty.
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at (at most [`MAX_PENALTY_WINDOW`]).
    pub penalty_last_n: usize,
    /// Added to the logit of a token before sampling (-inf bans it); at most [`MAX_LOGIT_BIAS`]
    /// entries. On the wire a `{"token id": bias}` object, where `null` (what `JSON.stringify`
    /// makes of `-Infinity`) is -inf.
    #[serde(with = "logit_bias_map")]
    pub logit_bias: Vec<(u32, f32)>,
    /// Same seed, same tokens. None draws a seed from the clock.
    pub seed: Option<u64>,
    /// Generation stops when the text contains one of these; it is not part of the output. On
    /// the wire a string or an array of strings.
    #[serde(deserialize_with = "one_or_many")]
    pub stop: Vec<String>,
    /// Generation stops after one of these tokens (in addition to the model's end tokens).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// Report the top-N log-probabilities of each generated step (reads back full logits).
    pub logprobs: usize,
    /// OpenAI's `response_format`: the output is any JSON object, or JSON valid against a
    /// schema (`constraint`).
    pub response_format: Option<ResponseFormat>,
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    pub regex: Option<String>,
    /// A grammar in llguidance's Lark syntax that the output follows.
    pub grammar: Option<String>,
    /// OpenAI's `tools`: functions the model may call (tools.rs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `none`, `auto` (the default with tools), `required`, or one named function.
    pub tool_choice: Option<ToolChoice>,
    /// Whether one answer may make several calls (default true).
    pub parallel_tool_calls: Option<bool>,
}

impl Default for GenerateOptions {
    /// llama.cpp's defaults.
    fn default() -> Self {
        Self {
            max_tokens: 256,
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: Vec::new(),
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: 0,
            response_format: None,
            regex: None,
            grammar: None,
            tools: Vec::new(),
            tool_choice: None,
            parallel_tool_calls: None,
        }
    }
}

impl GenerateOptions {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether the output is held to a grammar: a constraint, or tools in play.
    pub fn is_constrained(&self) -> bool {
        self.tool_use().is_some() || self.constraint().is_ok_and(|c| c.is_some())
    }

    /// What the output is held to: at most one of `response_format` (other than text), `regex`
    /// and `grammar`, else `invalid_option`.
    pub fn constraint(&self) -> Result<Option<OutputConstraint<'_>>, ModelError> {
        let format = match &self.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::JsonObject) => Some(OutputConstraint::JsonObject),
            Some(ResponseFormat::JsonSchema { json_schema }) => Some(OutputConstraint::JsonSchema(json_schema)),
        };
        let given: Vec<OutputConstraint<'_>> =
            [format, self.regex.as_deref().map(OutputConstraint::Regex), self.grammar.as_deref().map(OutputConstraint::Grammar)]
                .into_iter()
                .flatten()
                .collect();
        match given.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(*one)),
            [first, second, ..] => Err(ModelError::InvalidOption {
                name: second.field(),
                reason: format!("{} and {} are both given; a request takes one constraint", first.field(), second.field()),
            }),
        }
    }

    /// Checks every option against its range for a model with `vocab` tokens, and every
    /// request limit (the [`MAX_PENALTY_WINDOW`]-style constants of this module), before any
    /// work: an option out of range is an `invalid_option` error naming it.
    pub fn validate(&self, vocab: usize) -> Result<(), ModelError> {
        self.validate_for_any_model()?;
        let bad = |name: &'static str, reason: String| Err(ModelError::InvalidOption { name, reason });
        if let Some(&(id, _)) = self.logit_bias.iter().find(|&&(id, _)| id as usize >= vocab) {
            return bad("logit_bias", format!("token id {id} is outside the vocabulary of {vocab}"));
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            return bad("stop_token_ids", format!("token id {id} is outside the vocabulary of {vocab}"));
        }
        Ok(())
    }

    /// The checks of [`GenerateOptions::validate`] that need no model: all but the token ids
    /// against its vocabulary. The browser package runs them before it sends a request to a
    /// remote server, so a mistake fails there with the code a local engine gives.
    pub fn validate_for_any_model(&self) -> Result<(), ModelError> {
        let bad = |name: &'static str, reason: String| Err(ModelError::InvalidOption { name, reason });
        if self.max_tokens == 0 {
            return bad("max_tokens", "must be at least 1".into());
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", format!("{} must be a finite number >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} must be in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} must be in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", format!("{} must be a finite number > 0", self.repetition_penalty));
        }
        for (name, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("{v} must be in [-2, 2]"));
            }
        }
        if self.penalty_last_n > MAX_PENALTY_WINDOW {
            return bad("penalty_last_n", format!("{} must be at most {MAX_PENALTY_WINDOW}", self.penalty_last_n));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad("logit_bias", format!("{} entries, at most {MAX_LOGIT_BIAS} are allowed", self.logit_bias.len()));
        }
        for &(id, bias) in &self.logit_bias {
            if bias.is_nan() || bias == f32::INFINITY {
                return bad("logit_bias", format!("bias {bias} for token {id} must be a number or -inf"));
            }
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return bad("stop_token_ids", format!("{} ids, at most {MAX_STOP_TOKEN_IDS} are allowed", self.stop_token_ids.len()));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return bad("stop", format!("{} stop strings, at most {MAX_STOP_STRINGS} are allowed", self.stop.len()));
        }
        if self.stop.iter().any(String::is_empty) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if let Some(long) = self.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return bad("stop", format!("a stop string of {} bytes, at most {MAX_STOP_BYTES} are allowed", long.len()));
        }
        if self.logprobs > MAX_LOGPROBS {
            return bad("logprobs", format!("{} must be at most {MAX_LOGPROBS}", self.logprobs));
        }
        match self.constraint()? {
            Some(OutputConstraint::Regex("")) => return bad("regex", "must not be empty".into()),
            Some(OutputConstraint::Grammar(text)) if text.trim().is_empty() => return bad("grammar", "must not be empty".into()),
            Some(OutputConstraint::JsonSchema(format)) if !format.schema.as_ref().is_none_or(|s| s.is_object() || s.is_boolean()) => {
                return bad("response_format", "json_schema.schema must be a JSON Schema object".into())
            }
            _ => {}
        }
        self.validate_tools()
    }
}

/// `logit_bias` on the wire: `{"token id": bias}` (OpenAI's form), in ascending id order when
/// read. `-inf` is written as `null` (JSON has no infinities) and `null` read as `-inf`.
mod logit_bias_map {
    use super::*;

    pub fn serialize<S: Serializer>(bias: &[(u32, f32)], serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(bias.len()))?;
        for &(id, b) in bias {
            map.serialize_entry(&id.to_string(), &(b != f32::NEG_INFINITY).then_some(b))?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<(u32, f32)>, D::Error> {
        struct BiasVisitor;
        impl<'de> Visitor<'de> for BiasVisitor {
            type Value = Vec<(u32, f32)>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object mapping token ids to biases")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((key, bias)) = map.next_entry::<String, Option<f32>>()? {
                    let id = key
                        .trim()
                        .parse::<u32>()
                        .map_err(|_| de::Error::custom(format!("invalid option logit_bias: key {key:?} is not a token id")))?;
                    out.push((id, bias.unwrap_or(f32::NEG_INFINITY)));
                }
                out.sort_by_key(|&(id, _)| id);
                Ok(out)
            }
        }
        deserializer.deserialize_map(BiasVisitor)
    }
}

/// `stop` on the wire: one string or an array of strings.
fn one_or_many<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    struct StopVisitor;
    impl<'de> Visitor<'de> for StopVisitor {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or an array of strings")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(vec![s.to_owned()])
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_any(StopVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid_option_name(options: &GenerateOptions, vocab: usize) -> Option<&'static str> {
        match options.validate(vocab) {
            Err(e @ ModelError::InvalidOption { name, .. }) => {
                assert_eq!(e.code(), "invalid_option");
                assert!(e.to_string().contains(name), "{e} should name {name}");
                Some(name)
            }
            Err(other) => panic!("expected InvalidOption, got {other:?}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn defaults_are_valid_and_bad_options_name_themselves() {
        assert!(GenerateOptions::default().validate(100).is_ok());
        let cases: Vec<(GenerateOptions, &str)> = vec![
            (GenerateOptions { temperature: -1.0, ..Default::default() }, "temperature"),
            (GenerateOptions { top_p: 0.0, ..Default::default() }, "top_p"),
            (GenerateOptions { min_p: 1.5, ..Default::default() }, "min_p"),
            (GenerateOptions { max_tokens: 0, ..Default::default() }, "max_tokens"),
            (GenerateOptions { logit_bias: vec![(100, 1.0)], ..Default::default() }, "logit_bias"),
            (GenerateOptions { logit_bias: vec![(1, f32::INFINITY)], ..Default::default() }, "logit_bias"),
            (GenerateOptions { stop: vec![String::new()], ..Default::default() }, "stop"),
            (GenerateOptions { stop_token_ids: vec![100], ..Default::default() }, "stop_token_ids"),
            (GenerateOptions { frequency_penalty: 3.0, ..Default::default() }, "frequency_penalty"),
            (GenerateOptions { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
        ];
        for (options, expected) in cases {
            assert_eq!(invalid_option_name(&options, 100), Some(expected), "{options:?}");
            // Without a model, only the token ids against its vocabulary go unchecked.
            let vocab_only = matches!(expected, "logit_bias" | "stop_token_ids") && options.validate(u32::MAX as usize).is_ok();
            assert_eq!(options.validate_for_any_model().is_ok(), vocab_only, "{options:?}");
        }
    }

    /// Each request limit: at the limit is fine, one past it is `invalid_option` naming the option.
    #[test]
    fn request_limits_are_checked_up_front() {
        let vocab = 10_000;
        let bias = |n: usize| (0..n as u32).map(|id| (id, -1.0)).collect::<Vec<_>>();
        let stops = |n: usize| (0..n).map(|i| format!("stop{i}")).collect::<Vec<_>>();
        type Make = Box<dyn Fn(usize) -> GenerateOptions>;
        let limits: Vec<(&str, Make, usize)> = vec![
            ("penalty_last_n", Box::new(|n| GenerateOptions { penalty_last_n: n, ..Default::default() }), MAX_PENALTY_WINDOW),
            ("logit_bias", Box::new(move |n| GenerateOptions { logit_bias: bias(n), ..Default::default() }), MAX_LOGIT_BIAS),
            ("stop", Box::new(move |n| GenerateOptions { stop: stops(n), ..Default::default() }), MAX_STOP_STRINGS),
            ("stop", Box::new(|n| GenerateOptions { stop: vec!["x".repeat(n)], ..Default::default() }), MAX_STOP_BYTES),
            (
                "stop_token_ids",
                Box::new(|n| GenerateOptions { stop_token_ids: (0..n as u32).collect(), ..Default::default() }),
                MAX_STOP_TOKEN_IDS,
            ),
            ("logprobs", Box::new(|n| GenerateOptions { logprobs: n, ..Default::default() }), MAX_LOGPROBS),
        ];
        for (name, make, limit) in limits {
            assert_eq!(invalid_option_name(&make(limit), vocab), None, "{name} at its limit {limit}");
            assert_eq!(invalid_option_name(&make(limit + 1), vocab), Some(name), "{name} past its limit {limit}");
        }
    }

    #[test]
    fn wire_format_has_the_packages_names_and_defaults() {
        let parse = |json: &str| serde_json::from_str::<GenerateOptions>(json);
        assert_eq!(parse("{}").unwrap(), GenerateOptions::default());
        let o =
            parse(r#"{"max_tokens": 5, "temperature": 0, "stop": "\n", "logit_bias": {"7": -1.5, " 3 ": null}, "seed": 9, "logprobs": 2}"#)
                .unwrap();
        assert_eq!(o.max_tokens, 5);
        assert!(o.is_greedy());
        assert_eq!(o.stop, ["\n"]);
        assert_eq!(o.logit_bias, [(3, f32::NEG_INFINITY), (7, -1.5)]);
        assert_eq!(o.seed, Some(9));
        assert_eq!(o.logprobs, 2);
        assert_eq!(o.top_k, GenerateOptions::default().top_k);
        assert_eq!(parse(r#"{"stop": ["a", "b"]}"#).unwrap().stop, ["a", "b"]);
        let e = parse(r#"{"logit_bias": {"x": 1}}"#).unwrap_err().to_string();
        assert!(e.contains("logit_bias") && e.contains("\"x\""), "{e}");
        assert!(parse(r#"{"stop": 3}"#).is_err());
        assert!(parse(r#"{"max_tokens": -1}"#).is_err());
    }

    #[test]
    fn wire_format_round_trips() {
        let options = GenerateOptions {
            max_tokens: 7,
            logit_bias: vec![(1, f32::NEG_INFINITY), (4, 2.5)],
            seed: Some(u64::MAX),
            stop: vec!["a".into(), "b".into()],
            stop_token_ids: vec![2],
            ignore_eos: true,
            logprobs: 3,
            ..GenerateOptions::greedy()
        };
        let json = serde_json::to_value(&options).unwrap();
        assert_eq!(json["logit_bias"], serde_json::json!({"1": null, "4": 2.5}));
        assert_eq!(serde_json::from_value::<GenerateOptions>(json).unwrap(), options);
    }
}
