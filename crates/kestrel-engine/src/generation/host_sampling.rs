//! Sampling on the host, from a step's logits: the CPU backend's batched rows, every step of a
//! constrained output on the CPU backend, and on the GPU where the request reads logprobs (else
//! the GPU applies the mask itself, `Graph::set_token_mask`). The request's penalties and logit bias go first, then
//! the constraint's mask (which only sets disallowed tokens to -inf, so the order changes no
//! draw), then the sampler with the request's seed and the step's draw number. The sampler is
//! `kestrel_ops::reference::sample`, the CPU backend's own: there a step the constraint leaves
//! alone draws the token an unconstrained step draws. The GPU's sampler follows the same
//! algorithm, seed and draw numbers in f32 on the device, so a sampled GPU step may differ from
//! the host's where two tokens' cumulative probabilities straddle the draw.

use kestrel_ops::params::SamplingParams;
use kestrel_ops::reference::sample;

use kestrel_model::ModelError;

use super::constraint::TokenMatcher;
use super::options::GenerateOptions;
use super::penalties::PenaltyPolicy;

/// What a sequence samples with on the host.
pub(crate) struct HostSampler<'a> {
    pub options: &'a GenerateOptions,
    pub sampling: &'a SamplingParams,
    /// The prompt and the tokens generated so far (the penalties' window).
    pub history: &'a [u32],
    pub draw: u32,
}

impl HostSampler<'_> {
    /// The token drawn from `logits` (masked by `matcher` when the output is constrained).
    pub(crate) fn sample(&self, logits: &[f32], matcher: Option<&mut TokenMatcher>) -> Result<u32, ModelError> {
        if matcher.is_none() && !PenaltyPolicy::new(self.options).is_active() {
            return Ok(sample::sample(logits, self.sampling, self.draw));
        }
        Ok(sample::sample(&self.processed(logits, matcher)?, self.sampling, self.draw))
    }

    /// `logits` after the penalties, the logit bias and the constraint's mask: what the sampler
    /// draws from (and what a speculative draft is checked against).
    pub(crate) fn processed(&self, logits: &[f32], matcher: Option<&mut TokenMatcher>) -> Result<Vec<f32>, ModelError> {
        let policy = PenaltyPolicy::new(self.options);
        let mut logits = if policy.is_active() {
            sample::apply_penalties(logits, &policy.entries(self.history), &policy.penalties)
        } else {
            logits.to_vec()
        };
        if let Some(matcher) = matcher {
            matcher.mask(&mut logits)?;
        }
        Ok(logits)
    }
}
