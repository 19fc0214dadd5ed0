//! A request's logit bias (OpenAI's `logit_bias`) and repetition penalties (llama.cpp's repeat,
//! OpenAI's frequency and presence) as the entries the GPU's penalty kernel applies: one per
//! distinct token, with its count in the recent window and the sum of its biases.

use std::collections::BTreeMap;

use kestrel_ops::params::{Penalties, PenaltyEntry};

use super::options::GenerateOptions;

/// What one request asks of the penalty kernel.
pub(crate) struct PenaltyPolicy<'a> {
    pub penalties: Penalties,
    /// How many of the latest tokens the penalties count (`penalty_last_n`).
    last_n: usize,
    bias: &'a [(u32, f32)],
}

impl<'a> PenaltyPolicy<'a> {
    pub fn new(options: &'a GenerateOptions) -> Self {
        Self {
            penalties: Penalties {
                repeat: options.repetition_penalty,
                frequency: options.frequency_penalty,
                presence: options.presence_penalty,
            },
            last_n: options.penalty_last_n,
            bias: &options.logit_bias,
        }
    }

    /// Whether the logits change at all; when they do, each step's entries depend on the
    /// tokens before it.
    pub fn is_active(&self) -> bool {
        self.penalties != Penalties::default() || !self.bias.is_empty()
    }

    /// The entries for a sequence whose tokens so far are `history`: the last `last_n` tokens
    /// counted (none when every penalty is off, as llama.cpp skips them), every bias.
    pub fn entries(&self, history: &[u32]) -> Vec<PenaltyEntry> {
        let window = if self.penalties == Penalties::default() { &[][..] } else { &history[history.len().saturating_sub(self.last_n)..] };
        penalty_entries(window, self.bias)
    }
}

/// Merges the recent-token window and the logit-bias list into one entry per distinct id (in
/// ascending id order), so that the GPU applies each token's processing exactly once.
fn penalty_entries(recent: &[u32], bias: &[(u32, f32)]) -> Vec<PenaltyEntry> {
    let mut merged: BTreeMap<u32, PenaltyEntry> = BTreeMap::new();
    for &token in recent {
        merged.entry(token).or_insert_with(|| PenaltyEntry::new(token, 0, 0.0)).count += 1;
    }
    for &(token, b) in bias {
        merged.entry(token).or_insert_with(|| PenaltyEntry::new(token, 0, 0.0)).bias += b;
    }
    merged.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(repeat: f32, last_n: usize, bias: Vec<(u32, f32)>) -> GenerateOptions {
        GenerateOptions { repetition_penalty: repeat, penalty_last_n: last_n, logit_bias: bias, ..Default::default() }
    }

    #[test]
    fn entries_count_the_window_and_sum_the_biases() {
        let o = options(1.3, 4, vec![(5, 1.5), (9, -1.0), (5, -0.25)]);
        let policy = PenaltyPolicy::new(&o);
        assert!(policy.is_active());
        // Only the last 4 tokens count: 7 twice, 5 and 2 once; 3 and 8 fall outside the window.
        let got = policy.entries(&[3, 8, 7, 5, 7, 2]);
        let want =
            vec![PenaltyEntry::new(2, 1, 0.0), PenaltyEntry::new(5, 1, 1.25), PenaltyEntry::new(7, 2, 0.0), PenaltyEntry::new(9, 0, -1.0)];
        assert_eq!(got, want);
    }

    #[test]
    fn without_penalties_only_the_biases_apply() {
        let o = options(1.0, 64, vec![(4, f32::NEG_INFINITY)]);
        let policy = PenaltyPolicy::new(&o);
        assert!(policy.is_active());
        assert_eq!(policy.entries(&[4, 4, 1]), vec![PenaltyEntry::new(4, 0, f32::NEG_INFINITY)]);
        let plain = options(1.0, 64, vec![]);
        assert!(!PenaltyPolicy::new(&plain).is_active());
        assert!(PenaltyPolicy::new(&plain).entries(&[1, 2, 3]).is_empty());
    }
}
