//! The rule that decides, row by row, which drafted tokens the target keeps (Leviathan et al.,
//! "Fast Inference from Transformers via Speculative Decoding", 2023, and Chen et al. 2023).
//!
//! A verification row's logits are the target's at that position, after the request's whole
//! chain (penalties and logit bias, the constraint's mask; the caller applies them), so the
//! target distribution `p` is the one plain decoding would sample from. The draft came from `q`:
//! the draft model's distribution with the same sampling options, or, for a lookup draft, a point
//! mass on the drafted token.
//! - **Greedy** (temperature 0): the drafted token is kept when it is the row's argmax; else the
//!   argmax replaces it. The tokens are plain greedy decoding's.
//! - **Sampled**: the drafted token x is kept with probability min(1, p(x)/q(x)); else a token is
//!   drawn from the residual max(p - q, 0), normalised. Either way the token is distributed as
//!   `p` (the theorem of both papers), so the output's distribution is the target's.
//!
//! The uniform values come from the request's seed and the token's draw number (as every sampled
//! token's does), on a stream of their own for the acceptance test, so a seeded request repeats.

use kestrel_ops::params::SamplingParams;
use kestrel_ops::reference::sample::{distribution, draw_weighted, random_unit, sample};

/// A draft's distribution at one position: allowed token ids ascending and their probabilities
/// (`sample::distribution`'s form). None for a lookup draft: a point mass on the drafted token.
pub type DraftDistribution = Option<(Vec<u32>, Vec<f32>)>;

/// Salts the seed of the acceptance test's uniform value, apart from the draw's own.
const ACCEPT_STREAM: u32 = 0x9e37_79b9;
/// Salts the seed of the draft model's own draws.
pub(super) const DRAFT_STREAM: u32 = 0x85eb_ca6b;

/// What the target makes of one drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token stands.
    Accept,
    /// The drafted token falls; this token (the target's own) takes its place and ends the run.
    Replace(u32),
}

/// Checks `drafted`, proposed from `q`, against the target row `logits` (the whole chain already
/// applied), for the token with draw number `draw`.
pub fn verify(logits: &[f32], params: &SamplingParams, draw: u32, drafted: u32, q: &DraftDistribution) -> Verdict {
    if params.is_greedy() {
        let token = sample(logits, params, draw);
        return if token == drafted { Verdict::Accept } else { Verdict::Replace(token) };
    }
    let (ids, p) = distribution(logits, params);
    let prob = |ids: &[u32], probs: &[f32], t: u32| ids.binary_search(&t).map_or(0.0, |i| probs[i]);
    let p_x = prob(&ids, &p, drafted);
    let q_x = match q {
        Some((q_ids, q_p)) => prob(q_ids, q_p, drafted),
        None => 1.0,
    };
    let u = random_unit(params.seed ^ ACCEPT_STREAM, draw);
    // u < p/q, without dividing by a q of 0 (a token the draft could not have drawn).
    if u * q_x < p_x {
        return Verdict::Accept;
    }
    // The residual max(p - q, 0) over p's support (outside it p is 0, so the residual is too).
    let residual: Vec<f32> = ids
        .iter()
        .zip(&p)
        .map(|(&t, &p_t)| {
            let q_t = match q {
                Some((q_ids, q_p)) => prob(q_ids, q_p, t),
                None => f32::from(u8::from(t == drafted)),
            };
            (p_t - q_t).max(0.0)
        })
        .collect();
    // No residual left is rounding only (a rejection needs p(x) < q(x)): the plain draw then.
    Verdict::Replace(draw_weighted(&ids, &residual, random_unit(params.seed, draw)).unwrap_or_else(|| sample(logits, params, draw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u32) -> SamplingParams {
        SamplingParams { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, seed }
    }

    /// Pearson's chi-square statistic of `counts` against `expected` probabilities.
    fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts.iter().zip(expected).map(|(&c, &e)| (c as f64 - n as f64 * e).powi(2) / (n as f64 * e)).sum()
    }

    /// Draws the token at one position many times (a draw number each), drafting from `q` (or a
    /// fixed token), and returns the counts of each token of a 5-token vocabulary.
    fn draw_many(logits: &[f32], q: Option<&[f32]>, lookup: u32, draws: u32, seed: u32) -> [u64; 5] {
        let params = params(0.8, seed);
        let mut counts = [0u64; 5];
        for draw in 0..draws {
            let (drafted, dist) = match q {
                Some(q) => {
                    // The draft model's own draw from q, on its own stream.
                    let u = random_unit(seed ^ DRAFT_STREAM, draw);
                    let ids: Vec<u32> = (0..5).collect();
                    let drafted = draw_weighted(&ids, q, u).expect("q has mass");
                    (drafted, Some((ids, q.to_vec())))
                }
                None => (lookup, None),
            };
            let token = match verify(logits, &params, draw, drafted, &dist) {
                Verdict::Accept => drafted,
                Verdict::Replace(t) => t,
            };
            counts[token as usize] += 1;
        }
        counts
    }

    /// The target distribution of `logits` at temperature 0.8, as plain decoding samples it.
    fn target(logits: &[f32]) -> Vec<f64> {
        let (_, p) = distribution(logits, &params(0.8, 0));
        p.iter().map(|&v| f64::from(v)).collect()
    }

    /// 99.9th percentile of chi-square with 4 degrees of freedom (5 categories): a correct rule
    /// fails one run in a thousand by chance; the seeds are fixed, so a run repeats.
    const CHI2_4_999: f64 = 18.47;

    #[test]
    fn a_draft_models_tokens_verified_are_distributed_as_the_target() {
        let logits = [1.0, 0.2, -0.5, 2.0, 0.0];
        // A draft that puts its mass elsewhere: most of its tokens fall and the residual draws.
        let q = [0.05, 0.5, 0.3, 0.1, 0.05];
        let counts = draw_many(&logits, Some(&q), 0, 40_000, 7);
        let chi2 = chi_square(&counts, &target(&logits));
        assert!(chi2 < CHI2_4_999, "chi-square {chi2:.2} over {counts:?}");
    }

    #[test]
    fn lookup_tokens_verified_are_distributed_as_the_target() {
        let logits = [0.3, 1.5, -1.0, 0.9, 0.1];
        for drafted in [1, 2] {
            let counts = draw_many(&logits, None, drafted, 40_000, 11 + drafted);
            let chi2 = chi_square(&counts, &target(&logits));
            assert!(chi2 < CHI2_4_999, "drafted {drafted}: chi-square {chi2:.2} over {counts:?}");
        }
    }

    /// The test above can fail: a rule that always keeps the draft is far off.
    #[test]
    fn the_chi_square_check_catches_a_rule_that_keeps_every_draft() {
        let logits = [0.3, 1.5, -1.0, 0.9, 0.1];
        let mut counts = [0u64; 5];
        counts[2] = 40_000;
        assert!(chi_square(&counts, &target(&logits)) > CHI2_4_999);
    }

    #[test]
    fn greedy_keeps_the_argmax_and_replaces_anything_else() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        let greedy = params(0.0, 1);
        assert_eq!(verify(&logits, &greedy, 0, 1, &None), Verdict::Accept);
        assert_eq!(verify(&logits, &greedy, 0, 2, &None), Verdict::Replace(1));
    }

    #[test]
    fn a_token_the_target_bans_is_never_kept() {
        // A constraint's mask: -inf for token 3.
        let logits = [0.5, 0.2, 0.1, f32::NEG_INFINITY];
        for draw in 0..200 {
            assert_ne!(verify(&logits, &params(1.0, 3), draw, 3, &None), Verdict::Accept);
        }
    }
}
