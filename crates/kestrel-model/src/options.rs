//! Generation options, as OpenAI-style APIs name them, with their validation. Every option out
//! of range is an error naming the option and the allowed range.

use crate::ModelError;

#[derive(Clone, Debug)]
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
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Added to the logit of a token before sampling (-inf bans it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Same seed, same tokens. None draws a seed from the clock.
    pub seed: Option<u64>,
    /// Generation stops when the text contains one of these; it is not part of the output.
    pub stop: Vec<String>,
    /// Generation stops after one of these tokens (in addition to the model's end tokens).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end-of-generation tokens.
    pub ignore_eos: bool,
    /// Report the top-N log-probabilities of each generated step (reads back full logits).
    pub logprobs: usize,
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

    /// Checks every option against its range for a model with `vocab` tokens.
    pub fn validate(&self, vocab: usize) -> Result<(), ModelError> {
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
        if self.penalty_last_n > 4096 {
            return bad("penalty_last_n", format!("{} must be at most 4096", self.penalty_last_n));
        }
        for &(id, bias) in &self.logit_bias {
            if id as usize >= vocab {
                return bad("logit_bias", format!("token id {id} is outside the vocabulary of {vocab}"));
            }
            if bias.is_nan() || bias == f32::INFINITY {
                return bad("logit_bias", format!("bias {bias} for token {id} must be a number or -inf"));
            }
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            return bad("stop_token_ids", format!("token id {id} is outside the vocabulary of {vocab}"));
        }
        if self.stop.iter().any(String::is_empty) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if self.logprobs > 20 {
            return bad("logprobs", format!("{} must be at most 20", self.logprobs));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_options_name_themselves() {
        assert!(GenerateOptions::default().validate(100).is_ok());
        let cases: Vec<(GenerateOptions, &str)> = vec![
            (GenerateOptions { temperature: -1.0, ..Default::default() }, "temperature"),
            (GenerateOptions { top_p: 0.0, ..Default::default() }, "top_p"),
            (GenerateOptions { min_p: 1.5, ..Default::default() }, "min_p"),
            (GenerateOptions { max_tokens: 0, ..Default::default() }, "max_tokens"),
            (GenerateOptions { logit_bias: vec![(100, 1.0)], ..Default::default() }, "logit_bias"),
            (GenerateOptions { stop: vec![String::new()], ..Default::default() }, "stop"),
            (GenerateOptions { frequency_penalty: 3.0, ..Default::default() }, "frequency_penalty"),
        ];
        for (options, expected) in cases {
            match options.validate(100) {
                Err(ModelError::InvalidOption { name, .. }) => assert_eq!(name, expected),
                other => panic!("{expected}: expected InvalidOption, got {other:?}"),
            }
        }
    }
}
