//! A generation request in its wire form: a raw `prompt` or chat `messages`, and the generation
//! options under [`GenerateOptions`]' serde names (absent options take
//! [`GenerateOptions::default`], llama.cpp's defaults). The OpenAI layer (`openai.rs`) makes one
//! from either endpoint's body, for the browser engine and `kestrel serve` alike, so they accept
//! the same fields and refuse the same mistakes.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use kestrel_model::ChatMessage;

use crate::generation::{GenerateOptions, Prompt};

use crate::EngineError;

#[derive(Debug, Deserialize)]
pub struct Request {
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(flatten)]
    pub options: GenerateOptions,
    /// Fields neither of the above knows: refused (`deny_unknown_fields` does not work with
    /// `flatten`).
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

impl Request {
    /// Parses a request from JSON text; see [`Request::from_value`].
    pub fn parse(json: &str) -> Result<Request, EngineError> {
        Self::from_value(serde_json::from_str(json).map_err(|e| invalid(&e))?)
    }

    /// Parses a request from a JSON value. A field set to `null` is the same as an absent one;
    /// an unknown field is an `invalid_option` error that lists the known ones; a numeric option
    /// of the wrong type gets the message of one out of range, naming the option and its range.
    pub fn from_value(mut value: Value) -> Result<Request, EngineError> {
        if let Some(fields) = value.as_object_mut() {
            fields.retain(|_, v| !v.is_null());
            GenerateOptions::check_wire(fields)?;
        }
        let request = Request::deserialize(value).map_err(|e| invalid(&e))?;
        if let Some(field) = request.unknown.keys().next() {
            let known = serde_json::to_value(GenerateOptions::default()).map_err(|e| invalid(&e))?;
            let expected: Vec<String> = ["prompt", "messages"]
                .into_iter()
                .chain(known.as_object().into_iter().flat_map(|o| o.keys().map(String::as_str)))
                .map(|k| format!("`{k}`"))
                .collect();
            return Err(invalid(&format!("unknown field `{field}`, expected one of {}", expected.join(", "))));
        }
        Ok(request)
    }

    /// What to generate from: exactly one of `prompt` and `messages`.
    pub fn prompt(&self) -> Result<Prompt<'_>, EngineError> {
        match (&self.prompt, &self.messages) {
            (Some(text), None) => Ok(Prompt::Text(text)),
            (None, Some(messages)) => Ok(Prompt::Chat(messages)),
            _ => Err(EngineError::invalid("prompt", "invalid option prompt: give exactly one of prompt and messages")),
        }
    }

    /// Checks everything that needs no model: the prompt's form and every option's range (token
    /// ids are checked against the vocabulary when a model takes the request). A remote engine's
    /// requests are checked here before they are sent.
    pub fn validate_for_any_model(&self) -> Result<(), EngineError> {
        if matches!(self.prompt()?, Prompt::Text(_)) && !self.options.tools.is_empty() {
            return Err(EngineError::invalid(
                "tools",
                "invalid option tools: tools need chat messages (the template shows them to the model)",
            ));
        }
        self.options.validate_for_any_model().map_err(EngineError::from)
    }
}

fn invalid(e: &dyn std::fmt::Display) -> EngineError {
    EngineError::invalid("request", format!("invalid option request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Request, String> {
        Request::parse(json).map_err(|e| e.to_string())
    }

    #[test]
    fn requests_take_the_option_defaults_and_wire_names() {
        let Ok(r) = parse(r#"{"prompt": "hi"}"#) else { panic!() };
        assert_eq!(r.prompt.as_deref(), Some("hi"));
        assert!(matches!(r.prompt(), Ok(Prompt::Text("hi"))));
        assert_eq!(r.options, GenerateOptions::default());
        let Ok(r) = parse(
            r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "temperature": 0, "top_k": 1, "stop": "\n",
                "logit_bias": {"5": -2, "1": null}, "seed": 7, "penalty_last_n": 10, "ignore_eos": true, "logprobs": 2, "min_p": null}"#,
        ) else {
            panic!()
        };
        assert!(matches!(r.prompt(), Ok(Prompt::Chat(m)) if m.len() == 1));
        let o = r.options;
        assert_eq!(
            (o.max_tokens, o.temperature, o.top_k, o.seed, o.penalty_last_n, o.ignore_eos, o.logprobs),
            (3, 0.0, 1, Some(7), 10, true, 2)
        );
        assert_eq!(o.stop, ["\n"]);
        assert_eq!(o.logit_bias, [(1, f32::NEG_INFINITY), (5, -2.0)]);
        // null is the same as absent.
        assert_eq!(o.min_p, GenerateOptions::default().min_p);
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused() {
        let err = |json: &str| match Request::parse(json) {
            Ok(_) => panic!("{json} parsed"),
            Err(e) => {
                assert_eq!(e.code, "invalid_option");
                e.to_string()
            }
        };
        let e = err(r#"{"prompt": "hi", "max_token": 3}"#);
        assert!(e.contains("unknown field `max_token`") && e.contains("`max_tokens`") && e.contains("`prompt`"), "{e}");
        let e = err(r#"{"prompt": "hi", "logit_bias": {"x": 1}}"#);
        assert!(e.contains("logit_bias"), "{e}");
        err(r#"{"prompt": "hi", "stop": 5}"#);
        err(r#"["hi"]"#);
        err("not json");
        let Ok(neither) = Request::parse("{}") else { panic!() };
        assert!(neither.prompt().is_err());
        let Ok(both) = Request::parse(r#"{"prompt": "a", "messages": []}"#) else { panic!() };
        assert!(both.prompt().is_err());
    }

    /// The issue's cases: serde's words ("invalid value: integer `-5`, expected usize") were the
    /// message; now the option and its range are, and the option is the error's `param`.
    #[test]
    fn numeric_options_of_the_wrong_type_name_themselves() {
        for (json, param, message) in [
            (r#"{"prompt": "hi", "max_tokens": -5}"#, "max_tokens", "invalid option max_tokens: must be an integer of at least 1, got -5"),
            (r#"{"prompt": "hi", "top_k": -1}"#, "top_k", "invalid option top_k: must be an integer of at least 0, got -1"),
            (r#"{"prompt": "hi", "seed": 1.5}"#, "seed", "invalid option seed: must be an integer of at least 0, got 1.5"),
            (
                r#"{"prompt": "hi", "temperature": "0"}"#,
                "temperature",
                "invalid option temperature: must be a number from 0 to 2, got \"0\"",
            ),
        ] {
            let Err(e) = Request::parse(json) else { panic!("{json} parsed") };
            assert_eq!((e.code, e.param.as_deref(), e.message.as_str()), ("invalid_option", Some(param), message), "{json}");
        }
        // In range, or out of range but of the right type: refused by the checks every front end
        // runs before a model sees the request, in the same words.
        let Ok(hot) = Request::parse(r#"{"prompt": "hi", "temperature": 2.5}"#) else { panic!("a number") };
        let e = hot.validate_for_any_model().expect_err("temperature 2.5");
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("temperature"), "invalid option temperature: must be a number from 0 to 2, got 2.5")
        );
    }
}
