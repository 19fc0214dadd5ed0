//! Generation options, as OpenAI-style APIs name them, with their validation. Every option out
//! of range is an error naming the option and the allowed range: OpenAI's range for the options
//! OpenAI defines, Kestrel's for its own (`NUMERIC_OPTIONS` has the numeric ones).
//!
//! This type is also the wire format: it (de)serializes with serde under the names the browser
//! package sends (`max_tokens`, `stop` as a string or an array, `logit_bias` as a
//! `{"token id": bias}` object, ...), and absent fields take [`GenerateOptions::default`].

use std::fmt;

use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use kestrel_model::ModelError;

use super::constraint::{OutputConstraint, ResponseFormat};
use super::tools::{Tool, ToolChoice, ToolMode, ToolUse, MAX_TOOLS};

/// The penalty window and the bias list are bounded by the GPU penalty buffer, which holds
/// `MAX_PENALTY_WINDOW + MAX_LOGIT_BIAS` entries.
pub use kestrel_model::{MAX_LOGIT_BIAS, MAX_PENALTY_WINDOW};
/// Most top log-probabilities reported per step (`logprobs`), as OpenAI's API allows.
pub const MAX_LOGPROBS: usize = 20;
/// The largest `logit_bias` either way, as OpenAI's API allows (-100 about bans a token; -inf bans it).
pub const MAX_BIAS: f32 = 100.0;
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
    /// Whether the engine's speculative decoding, where it has it, serves this request (default
    /// true): false decodes one token per step.
    pub speculative: bool,
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
            speculative: true,
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
        for option in &NUMERIC_OPTIONS {
            let value = (option.value)(self);
            if !option.allowed.allows(value) {
                return Err(option.allowed.refuse(option.name, value));
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad("logit_bias", format!("{} entries, at most {MAX_LOGIT_BIAS} are allowed", self.logit_bias.len()));
        }
        if let Some(&(id, bias)) = self.logit_bias.iter().find(|&&(_, bias)| !(bias == f32::NEG_INFINITY || bias.abs() <= MAX_BIAS)) {
            return Err(bias_refused(id, bias));
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

    /// Checks the JSON values of the numeric options and of `logit_bias`'s biases before serde
    /// reads them into `GenerateOptions`: a value their field cannot hold (a negative or
    /// fractional count, a string) is refused here with the message a value out of range gets,
    /// naming the option and its range, instead of serde's. `fields`: a request's, those set to
    /// `null` removed.
    pub fn check_wire(fields: &Map<String, Value>) -> Result<(), ModelError> {
        for option in &NUMERIC_OPTIONS {
            match fields.get(option.name) {
                Some(value) if !(option.fits)(value) => return Err(option.allowed.refuse(option.name, value)),
                _ => {}
            }
        }
        // The ids are checked as they are read (`logit_bias_map`), with their own message.
        if let Some(Value::Object(biases)) = fields.get("logit_bias") {
            if let Some((id, bias)) = biases.iter().find(|(_, bias)| !fits::<Option<f32>>(bias)) {
                return Err(bias_refused(id, bias));
            }
        }
        Ok(())
    }
}

/// The values a numeric option allows. Its message names the option and this range, for a value
/// out of it and for one of the wrong type alike.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Allowed {
    /// A whole number from `min` to `max` (`None`: as large as its field holds).
    Integer { min: u64, max: Option<u64> },
    /// A number from `min` to `max`, both finite.
    Number { min: f32, max: f32 },
    /// A finite number above 0.
    Positive,
}

impl Allowed {
    /// `max_tokens`: OpenAI's chat endpoint also calls it `max_completion_tokens`.
    pub const MAX_TOKENS: Allowed = Allowed::Integer { min: 1, max: None };
    /// `logprobs`' count: OpenAI's chat endpoint calls it `top_logprobs`.
    pub const LOGPROBS: Allowed = Allowed::Integer { min: 0, max: Some(MAX_LOGPROBS as u64) };

    /// The whole number a JSON value gives for an option counted in whole numbers, if this allows
    /// it; else `invalid_option` naming `name` (the name the request used, which may be one of
    /// OpenAI's other names for the option).
    pub fn count(self, name: &'static str, value: &Value) -> Result<u64, ModelError> {
        value.as_u64().filter(|&n| self.allows(Num::Count(n))).ok_or_else(|| self.refuse(name, value))
    }

    fn allows(self, value: Num) -> bool {
        match (self, value) {
            (Self::Integer { min, max }, Num::Count(n)) => n >= min && max.is_none_or(|max| n <= max),
            // NaN and the infinities are in no range.
            (Self::Number { min, max }, Num::Real(x)) => (min..=max).contains(&x),
            (Self::Positive, Num::Real(x)) => x.is_finite() && x > 0.0,
            // An option of one kind checked as another: a mistake in `NUMERIC_OPTIONS`.
            _ => false,
        }
    }

    fn refuse(self, name: &'static str, got: impl fmt::Display) -> ModelError {
        let range = match self {
            Self::Integer { min, max: None } => format!("an integer of at least {min}"),
            Self::Integer { min, max: Some(max) } => format!("an integer from {min} to {max}"),
            Self::Number { min, max } => format!("a number from {min} to {max}"),
            Self::Positive => "a finite number above 0".into(),
        };
        ModelError::InvalidOption { name, reason: format!("must be {range}, got {got}") }
    }
}

/// A numeric option's value, as its field holds it.
#[derive(Clone, Copy, Debug)]
enum Num {
    Count(u64),
    Real(f32),
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => n.fmt(f),
            Self::Real(x) => x.fmt(f),
        }
    }
}

/// A numeric option of [`GenerateOptions`], under its wire name.
struct NumericOption {
    name: &'static str,
    allowed: Allowed,
    /// Whether serde reads a JSON value into the field (else it refuses it in its own words).
    fits: fn(&Value) -> bool,
    value: fn(&GenerateOptions) -> Num,
}

/// The numeric options, each with its range: OpenAI's for those it defines (`max_tokens`,
/// `temperature`, `top_p`, the frequency and presence penalties, `logprobs` as `top_logprobs`),
/// Kestrel's (llama.cpp's meanings) for the others.
const NUMERIC_OPTIONS: [NumericOption; 11] = [
    NumericOption { name: "max_tokens", allowed: Allowed::MAX_TOKENS, fits: fits::<usize>, value: |o| Num::Count(o.max_tokens as u64) },
    NumericOption {
        name: "temperature",
        allowed: Allowed::Number { min: 0.0, max: 2.0 },
        fits: fits::<f32>,
        value: |o| Num::Real(o.temperature),
    },
    NumericOption {
        name: "top_k",
        allowed: Allowed::Integer { min: 0, max: None },
        fits: fits::<u32>,
        value: |o| Num::Count(o.top_k.into()),
    },
    NumericOption { name: "top_p", allowed: Allowed::Number { min: 0.0, max: 1.0 }, fits: fits::<f32>, value: |o| Num::Real(o.top_p) },
    NumericOption { name: "min_p", allowed: Allowed::Number { min: 0.0, max: 1.0 }, fits: fits::<f32>, value: |o| Num::Real(o.min_p) },
    NumericOption { name: "repetition_penalty", allowed: Allowed::Positive, fits: fits::<f32>, value: |o| Num::Real(o.repetition_penalty) },
    NumericOption {
        name: "frequency_penalty",
        allowed: Allowed::Number { min: -2.0, max: 2.0 },
        fits: fits::<f32>,
        value: |o| Num::Real(o.frequency_penalty),
    },
    NumericOption {
        name: "presence_penalty",
        allowed: Allowed::Number { min: -2.0, max: 2.0 },
        fits: fits::<f32>,
        value: |o| Num::Real(o.presence_penalty),
    },
    NumericOption {
        name: "penalty_last_n",
        allowed: Allowed::Integer { min: 0, max: Some(MAX_PENALTY_WINDOW as u64) },
        fits: fits::<usize>,
        value: |o| Num::Count(o.penalty_last_n as u64),
    },
    // Absent, the seed is drawn from the clock: any u64.
    NumericOption {
        name: "seed",
        allowed: Allowed::Integer { min: 0, max: None },
        fits: fits::<u64>,
        value: |o| Num::Count(o.seed.unwrap_or(0)),
    },
    NumericOption { name: "logprobs", allowed: Allowed::LOGPROBS, fits: fits::<usize>, value: |o| Num::Count(o.logprobs as u64) },
];

fn fits<T: DeserializeOwned>(value: &Value) -> bool {
    T::deserialize(value).is_ok()
}

/// A bias out of [-`MAX_BIAS`, `MAX_BIAS`] (or not a number), for token `id`.
fn bias_refused(id: impl fmt::Display, bias: impl fmt::Display) -> ModelError {
    ModelError::InvalidOption {
        name: "logit_bias",
        reason: format!(
            "the bias of token {id} must be a number from -{MAX_BIAS} to {MAX_BIAS}, or null (-Infinity) to ban it, got {bias}"
        ),
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

impl GenerateOptions {
    /// The tools in play: none without `tools` or with `tool_choice: "none"`.
    pub(crate) fn tool_use(&self) -> Option<ToolUse<'_>> {
        if self.tools.is_empty() {
            return None;
        }
        let (named, required) = match &self.tool_choice {
            Some(ToolChoice::Mode(ToolMode::None)) => return None,
            None | Some(ToolChoice::Mode(ToolMode::Auto)) => (None, false),
            Some(ToolChoice::Mode(ToolMode::Required)) => (None, true),
            Some(ToolChoice::Named(n)) => (Some(n.function.name.as_str()), true),
        };
        Some(ToolUse { tools: &self.tools, named, required, parallel: self.parallel_tool_calls.unwrap_or(true) })
    }

    /// The checks of `tools`, `tool_choice` and `parallel_tool_calls` that need no model.
    pub(crate) fn validate_tools(&self) -> Result<(), ModelError> {
        let bad = |name: &'static str, reason: String| Err(ModelError::InvalidOption { name, reason });
        if self.tools.len() > MAX_TOOLS {
            return bad("tools", format!("{} tools, at most {MAX_TOOLS} are allowed", self.tools.len()));
        }
        for (i, tool) in self.tools.iter().enumerate() {
            let name = &tool.function.name;
            if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return bad("tools", format!("tools[{i}].function.name {name:?} must be 1 to 64 letters, digits, _ or -"));
            }
            if self.tools[..i].iter().any(|t| &t.function.name == name) {
                return bad("tools", format!("two tools are named {name:?}"));
            }
            if !tool.function.parameters.as_ref().is_none_or(Value::is_object) {
                return bad("tools", format!("tools[{i}].function.parameters must be a JSON Schema object"));
            }
        }
        match &self.tool_choice {
            Some(ToolChoice::Named(n)) if !self.tools.iter().any(|t| t.function.name == n.function.name) => {
                return bad("tool_choice", format!("names the function {:?}, which is not in tools", n.function.name));
            }
            Some(ToolChoice::Mode(ToolMode::Auto | ToolMode::Required) | ToolChoice::Named(_)) if self.tools.is_empty() => {
                return bad("tool_choice", "is given without tools".into());
            }
            _ => {}
        }
        if self.tool_use().is_some() {
            if let Some(other) = self.constraint()? {
                return bad(other.field(), "cannot be combined with tools (the calls have their own grammar)".into());
            }
        }
        Ok(())
    }
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
            (GenerateOptions { top_p: 1.5, ..Default::default() }, "top_p"),
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

    /// How the engine checks a request's options: their JSON values, then the options serde
    /// read from them. The message of the first refusal, if any.
    fn refusal(json: Value) -> Option<String> {
        let Value::Object(fields) = &json else { panic!("{json} is not an object") };
        if let Err(e) = GenerateOptions::check_wire(fields) {
            return Some(e.to_string());
        }
        let options: GenerateOptions =
            serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{json} passed check_wire, serde refused it: {e}"));
        options.validate_for_any_model().err().map(|e| e.to_string())
    }

    /// Each numeric option just inside its range passes and just outside fails, in a message
    /// naming the option and the range: OpenAI's for the options OpenAI defines.
    #[test]
    fn numeric_options_take_openais_ranges() {
        use serde_json::json;
        for (name, inside, outside, range) in [
            ("max_tokens", json!(1), json!(0), "an integer of at least 1"),
            ("temperature", json!(0), json!(-0.01), "a number from 0 to 2"),
            ("temperature", json!(2), json!(2.01), "a number from 0 to 2"),
            ("top_p", json!(0), json!(-0.01), "a number from 0 to 1"),
            ("top_p", json!(1), json!(1.01), "a number from 0 to 1"),
            ("min_p", json!(0), json!(-0.01), "a number from 0 to 1"),
            ("min_p", json!(1), json!(1.01), "a number from 0 to 1"),
            ("frequency_penalty", json!(-2), json!(-2.01), "a number from -2 to 2"),
            ("frequency_penalty", json!(2), json!(2.01), "a number from -2 to 2"),
            ("presence_penalty", json!(-2), json!(-2.01), "a number from -2 to 2"),
            ("presence_penalty", json!(2), json!(2.01), "a number from -2 to 2"),
            ("repetition_penalty", json!(0.01), json!(0), "a finite number above 0"),
            ("penalty_last_n", json!(0), json!(-1), "an integer from 0 to 4096"),
            ("penalty_last_n", json!(4096), json!(4097), "an integer from 0 to 4096"),
            ("logprobs", json!(0), json!(-1), "an integer from 0 to 20"),
            ("logprobs", json!(20), json!(21), "an integer from 0 to 20"),
            ("top_k", json!(0), json!(-1), "an integer of at least 0"),
            ("seed", json!(0), json!(-1), "an integer of at least 0"),
        ] {
            assert_eq!(refusal(json!({ name: inside })), None, "{name}: {inside}");
            let e = refusal(json!({ name: outside })).unwrap_or_else(|| panic!("{name}: {outside} passed"));
            assert_eq!(e, format!("invalid option {name}: must be {range}, got {outside}"));
        }
        assert_eq!(refusal(json!({"seed": u64::MAX, "top_k": u32::MAX})), None);
        for bias in [json!(-100), json!(100), json!(null)] {
            assert_eq!(refusal(json!({"logit_bias": {"5": bias}})), None, "{bias}");
        }
        for bias in [json!(-100.5), json!(101)] {
            let e = refusal(json!({"logit_bias": {"5": bias}})).unwrap_or_else(|| panic!("bias {bias} passed"));
            assert!(e.starts_with("invalid option logit_bias: the bias of token 5 must be a number from -100 to 100"), "{e}");
        }
    }

    /// NaN and the infinities are in no option's range (JSON has none of them; a number too large
    /// for an f32 reads as infinity). Only `logit_bias` takes -inf: it bans the token.
    #[test]
    fn non_finite_numbers_are_refused() {
        type Make = fn(f32) -> GenerateOptions;
        let reals: [(&str, Make); 6] = [
            ("temperature", |x| GenerateOptions { temperature: x, ..Default::default() }),
            ("top_p", |x| GenerateOptions { top_p: x, ..Default::default() }),
            ("min_p", |x| GenerateOptions { min_p: x, ..Default::default() }),
            ("repetition_penalty", |x| GenerateOptions { repetition_penalty: x, ..Default::default() }),
            ("frequency_penalty", |x| GenerateOptions { frequency_penalty: x, ..Default::default() }),
            ("presence_penalty", |x| GenerateOptions { presence_penalty: x, ..Default::default() }),
        ];
        for (name, make) in reals {
            for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                assert_eq!(invalid_option_name(&make(x), 100), Some(name), "{name}: {x}");
            }
        }
        for bias in [f32::NAN, f32::INFINITY] {
            assert_eq!(
                invalid_option_name(&GenerateOptions { logit_bias: vec![(1, bias)], ..Default::default() }, 100),
                Some("logit_bias")
            );
        }
        assert_eq!(invalid_option_name(&GenerateOptions { logit_bias: vec![(1, f32::NEG_INFINITY)], ..Default::default() }, 100), None);
        let e = refusal(serde_json::json!({"temperature": 1e39})).expect("an f32 infinity");
        assert_eq!(e, "invalid option temperature: must be a number from 0 to 2, got inf");
    }

    /// A value of the wrong type (a negative or fractional count, a string for a number, a count
    /// past its field) gets the message of a value out of range, not serde's.
    #[test]
    fn wrong_types_name_the_option_and_its_range() {
        use serde_json::json;
        for (name, value, range) in [
            ("max_tokens", json!(-5), "an integer of at least 1"),
            ("max_tokens", json!(2.5), "an integer of at least 1"),
            ("max_tokens", json!(5.0), "an integer of at least 1"),
            ("max_tokens", json!("many"), "an integer of at least 1"),
            ("top_k", json!(-1), "an integer of at least 0"),
            ("top_k", json!(u64::from(u32::MAX) + 1), "an integer of at least 0"),
            ("seed", json!(1.5), "an integer of at least 0"),
            ("penalty_last_n", json!(true), "an integer from 0 to 4096"),
            ("logprobs", json!(-1), "an integer from 0 to 20"),
            ("temperature", json!("hot"), "a number from 0 to 2"),
            ("top_p", json!([0.5]), "a number from 0 to 1"),
            ("repetition_penalty", json!({}), "a finite number above 0"),
        ] {
            let e = refusal(json!({ name: value })).unwrap_or_else(|| panic!("{name}: {value} passed"));
            assert_eq!(e, format!("invalid option {name}: must be {range}, got {value}"));
        }
        let e = refusal(json!({"logit_bias": {"7": "ban"}})).expect("a bias that is no number");
        assert_eq!(
            e,
            "invalid option logit_bias: the bias of token 7 must be a number from -100 to 100, or null (-Infinity) to ban it, got \"ban\""
        );
        // Under OpenAI's other names for an option, the name the request used.
        let e = Allowed::LOGPROBS.count("top_logprobs", &json!(50)).expect_err("50 top log-probabilities");
        assert_eq!(e.to_string(), "invalid option top_logprobs: must be an integer from 0 to 20, got 50");
        assert_eq!(Allowed::MAX_TOKENS.count("max_completion_tokens", &json!(7)).ok(), Some(7));
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
