//! A request's sampler options and penalties.

/// Options of one request's sampler. `temperature <= 0` is greedy; `top_k == 0`, `top_p >= 1`
/// and `min_p == 0` disable their filters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// Mixed with the step's `StepParams::draw` by the RNG hash.
    pub seed: u32,
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks the ranges the samplers assume; the error says which option is out of range.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |what: &str| Err(format!("sampling: {what} ({self:?})"));
        if !self.temperature.is_finite() {
            return bad("temperature must be finite");
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        Ok(())
    }
}

impl Default for SamplingParams {
    /// llama.cpp's common defaults.
    fn default() -> Self {
        Self { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 0 }
    }
}

/// llama.cpp's penalties: `repeat` divides positive / multiplies non-positive logits of tokens in
/// the window; `frequency` is subtracted per occurrence and `presence` once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Default for Penalties {
    /// No penalty.
    fn default() -> Self {
        Self { repeat: 1.0, frequency: 0.0, presence: 0.0 }
    }
}

crate::gpu_struct! {
    /// One token's logit processing, as uploaded (`Entry`, the element of penalties.wgsl's
    /// storage array): its logit gets `bias` added, then, when `count > 0`, the repeat, frequency
    /// and presence penalties. A list holds each token at most once.
    #[derive(Debug, Default, PartialEq)]
    pub struct PenaltyEntry as Entry {
        pub token: u32,
        /// Occurrences in the recent-token window (0: bias only).
        pub count: u32,
        /// Sum of the logit biases given for this token (`f32::NEG_INFINITY` bans it).
        pub bias: f32,
        _pad: u32,
    }
}

impl PenaltyEntry {
    pub fn new(token: u32, count: u32, bias: f32) -> Self {
        Self { token, count, bias, _pad: 0 }
    }
}
