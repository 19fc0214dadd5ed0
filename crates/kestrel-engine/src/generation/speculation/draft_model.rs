//! A smaller model with the target's vocabulary that drafts tokens for it.
//!
//! The draft model keeps a KV slot per target slot, for the same sequence. Each draft first runs
//! what the draft's slot lacks of the sequence (its whole prompt the first time, then the tokens
//! the last verification kept), then one token at a time, the drafting sequences of a step
//! batched together. It drafts greedily for a greedy request, else from its own distribution
//! under the request's temperature, top-k, top-p and min-p (the `q` of the acceptance rule), under
//! the request's constraint, and stops where its top token's probability falls under `p_min`
//! (llama.cpp's rule) or at an end-of-generation token. Penalties are the target's alone: the
//! rule needs only the `q` the draft actually drew from.

use kestrel_model::{BatchRow, BatchSample, Model, ModelError, RowOutput};
use kestrel_ops::params::SamplingParams;
use kestrel_ops::reference::sample::{argmax, distribution, sample};
use std::time::Duration;
use web_time::Instant;

use super::verify::{DraftDistribution, DRAFT_STREAM};
use crate::generation::constraint::TokenMatcher;
use crate::generation::generator::{common_prefix, reusable_prefix};

pub struct DraftModel {
    model: Model,
}

/// One sequence's draft request (`DraftModel::draft`).
pub struct DraftRequest<'a> {
    pub slot: usize,
    /// The sequence's tokens so far; the last is the one the target runs next.
    pub history: &'a [u32],
    /// Tokens of `history` the draft's slot holds.
    pub cached: usize,
    /// Most tokens to draft.
    pub max: usize,
    pub params: SamplingParams,
    /// The draw number of the sequence's next token: the draft's own draws follow it.
    pub draw: u32,
    pub matcher: Option<&'a mut TokenMatcher>,
    /// Drafting stops where the draft's top token's probability falls under this.
    pub p_min: f32,
}

/// What the draft model proposed for one sequence.
#[derive(Debug, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// The distribution each token was drawn from (None where drafting was greedy).
    pub distributions: Vec<DraftDistribution>,
    /// Tokens of `history` followed by `tokens` whose KV rows the draft's slot now holds.
    pub cached: usize,
    /// The token-by-token passes it took part in, and their time (its drafting's cost per token,
    /// apart from catching up on the sequence).
    pub proposals: usize,
    pub proposing: Duration,
    /// Whether its first pass caught up on tokens the sequence took while it did not draft (a
    /// pause's plain steps): that pass's time is the pause's debt, not drafting's steady cost.
    pub caught_up: bool,
}

impl DraftModel {
    /// Takes `draft` as `target`'s draft model: the same tokens under the same ids, and logits
    /// of the same width, else `invalid_option` naming the first id that differs.
    pub fn new(mut draft: Model, target: &Model) -> Result<Self, ModelError> {
        let refuse = |reason: String| Err(ModelError::InvalidOption { name: "draft_model", reason });
        let (t, d) = (target.tokenizer(), draft.tokenizer());
        let ids = t.vocab_size().max(d.vocab_size());
        for id in 0..ids as u32 {
            let (a, b) = (t.token_bytes(id).ok(), d.token_bytes(id).ok());
            if a != b {
                let show = |x: Option<&[u8]>| x.map_or_else(|| "no token".to_string(), |b| format!("{:?}", String::from_utf8_lossy(b)));
                return refuse(format!("its vocabulary differs from the model's at token id {id}: {} against {}", show(b), show(a)));
            }
        }
        let (tv, dv) = (target.config().vocab, draft.config().vocab);
        if tv != dv {
            return refuse(format!("its logits are {dv} wide, the model's {tv}"));
        }
        // It runs every position the model does.
        let (tc, dc) = (target.context_length(), draft.context_length());
        if dc < tc {
            return refuse(format!("its KV cache holds {dc} tokens, the model's {tc}: load it with the model's context"));
        }
        draft.set_slots(target.slots())?;
        Ok(Self { model: draft })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    /// Keeps `n` KV slots, as the target does.
    pub fn set_slots(&mut self, n: usize) -> Result<(), ModelError> {
        self.model.set_slots(n)
    }

    /// Forgets what every slot holds.
    pub fn reset(&mut self) {
        self.model.reset();
    }

    /// Of `prompt`, the tokens whose KV rows the draft's `slot` holds (its cached prefix), and
    /// takes the slot for a new sequence.
    pub fn claim_slot(&mut self, slot: usize, prompt: &[u32]) -> usize {
        let reused = reusable_prefix(common_prefix(self.model.slot_tokens(slot), prompt), prompt.len());
        self.model.set_slot_tokens(slot, Vec::new());
        reused
    }

    /// Leaves `tokens` in `slot` for the next sequence's prefix (a sequence's end).
    pub fn release_slot(&mut self, slot: usize, tokens: Vec<u32>) {
        self.model.set_slot_tokens(slot, tokens);
    }

    /// Runs `tokens[cached..]` into the draft's `slot` (in chunks, no logits), as the sequence's
    /// prompt enters the target: its first draft then has no prompt to catch up on, and the
    /// draft's prefill counts in the time to the first token, not in decoding. Returns the
    /// tokens the slot now holds.
    pub async fn prefill(&mut self, slot: usize, tokens: &[u32], cached: usize) -> Result<usize, ModelError> {
        let mut at = cached.min(tokens.len());
        for piece in tokens[at..].chunks(self.model.max_chunk()) {
            self.model.run_batch(&[row(slot, at, piece, false)]).await?;
            at += piece.len();
        }
        Ok(at)
    }

    /// Drafts for every request: what the slots lack (batched, a chunk at a time), then one
    /// batched pass per drafted token. A constraint's matcher is left as it was.
    pub async fn draft(&mut self, requests: &mut [DraftRequest<'_>]) -> Result<Vec<Draft>, ModelError> {
        // The last token always runs (it gives the first proposal), even where the slot has it.
        let mut drafts: Vec<Draft> =
            requests.iter().map(|r| Draft { cached: r.cached.min(r.history.len().saturating_sub(1)), ..Draft::default() }).collect();
        let mut taken = vec![0usize; requests.len()];
        let outcome = self.passes(requests, &mut drafts, &mut taken).await;
        // The matchers give back what they took for now, whatever the passes' outcome.
        for (r, n) in requests.iter_mut().zip(taken) {
            if let Some(m) = r.matcher.as_deref_mut() {
                m.forget_draft(n)?;
            }
        }
        outcome.map(|()| drafts)
    }

    /// The draft's passes (see `draft`), counting in `taken` the drafted tokens each request's
    /// matcher took for now.
    async fn passes(&mut self, requests: &mut [DraftRequest<'_>], drafts: &mut [Draft], taken: &mut [usize]) -> Result<(), ModelError> {
        let chunk = self.model.max_chunk();
        let histories: Vec<&[u32]> = requests.iter().map(|r| r.history).collect();
        let mut active: Vec<usize> = (0..requests.len()).filter(|&i| requests[i].max > 0 && !histories[i].is_empty()).collect();
        for &i in &active {
            drafts[i].caught_up = histories[i].len() - drafts[i].cached > STEADY_CATCH_UP;
        }
        // The catch-up's chunks before each one's last, which needs only its KV rows.
        loop {
            let behind: Vec<usize> = active.iter().copied().filter(|&i| histories[i].len() - drafts[i].cached > chunk).collect();
            if behind.is_empty() {
                break;
            }
            let rows: Vec<BatchRow<'_>> = behind
                .iter()
                .map(|&i| row(requests[i].slot, drafts[i].cached, &histories[i][drafts[i].cached..][..chunk], false))
                .collect();
            self.model.run_batch(&rows).await?;
            behind.iter().for_each(|&i| drafts[i].cached += chunk);
        }
        // Each pass runs what a slot lacks (the catch-up's last chunk, then the token drafted
        // last) and proposes the next token from its last row.
        let mut inputs: Vec<Vec<u32>> = active.iter().map(|&i| histories[i][drafts[i].cached..].to_vec()).collect();
        while !active.is_empty() {
            let rows: Vec<BatchRow<'_>> =
                active.iter().zip(&inputs).map(|(&i, tokens)| row(requests[i].slot, drafts[i].cached, tokens, true)).collect();
            let pass = Instant::now();
            let outputs = self.model.run_batch(&rows).await?;
            let took = pass.elapsed();
            drop(rows);
            let (mut next_active, mut next_inputs) = (Vec::new(), Vec::new());
            for ((&i, ran), output) in active.iter().zip(&inputs).zip(outputs) {
                drafts[i].cached += ran.len();
                drafts[i].proposals += 1;
                drafts[i].proposing += took;
                let logits = match output {
                    Some(RowOutput::Logits(logits)) | Some(RowOutput::Sampled(BatchSample { logits: Some(logits), .. })) => logits,
                    _ => return Err(ModelError::InvalidOption { name: "draft_model", reason: "a draft step returned no logits".into() }),
                };
                let (r, d) = (&mut requests[i], &mut drafts[i]);
                let Some(token) = propose(r, d, logits)? else { continue };
                // A draft ends at an end token, or at its length: neither runs on the draft.
                let is_end = self.model.tokenizer().is_eog(token) || r.matcher.as_ref().is_some_and(|m| m.is_end(token));
                if is_end || d.tokens.len() >= r.max {
                    continue;
                }
                if let Some(m) = r.matcher.as_deref_mut() {
                    if !m.draft(token)? {
                        d.tokens.pop();
                        d.distributions.pop();
                        continue;
                    }
                    taken[i] += 1;
                }
                next_active.push(i);
                next_inputs.push(vec![token]);
            }
            (active, inputs) = (next_active, next_inputs);
        }
        Ok(())
    }
}

/// Tokens a draft's first pass runs after a speculative step: the draft's last token, which it
/// proposed but never ran, and the target's own token after it.
const STEADY_CATCH_UP: usize = 2;

/// A draft pass's row: `tokens` at `pos` of `slot`, with the last row's logits where `last`
/// (the host draws the draft's token, on either backend: the GPU's own draw is ignored).
fn row(slot: usize, pos: usize, tokens: &[u32], last: bool) -> BatchRow<'_> {
    BatchRow { slot, pos, tokens, decoding: false, sample: last.then_some(0), logits: last, verify: false }
}

/// The draft's next token from its logits (masked by the request's constraint as the output
/// after the tokens drafted so far), or None where its top probability falls under `p_min`.
fn propose(r: &mut DraftRequest<'_>, d: &mut Draft, mut logits: Vec<f32>) -> Result<Option<u32>, ModelError> {
    if let Some(m) = r.matcher.as_deref_mut() {
        m.mask(&mut logits)?;
    }
    let draw = r.draw + d.tokens.len() as u32;
    let (token, top, dist) = if r.params.is_greedy() {
        let token = argmax(&logits) as u32;
        (token, top_probability(&logits), None)
    } else {
        let (ids, probs) = distribution(&logits, &r.params);
        let own = SamplingParams { seed: r.params.seed ^ DRAFT_STREAM, ..r.params };
        let token = sample(&logits, &own, draw);
        let top = probs.iter().copied().fold(0.0, f32::max);
        (token, top, Some((ids, probs)))
    };
    if top < r.p_min {
        return Ok(None);
    }
    d.tokens.push(token);
    d.distributions.push(dist);
    Ok(Some(token))
}

/// The probability of the likeliest token under the softmax of `logits`.
fn top_probability(logits: &[f32]) -> f32 {
    let Some(&max) = logits.get(argmax(logits)) else { return 0.0 };
    let total: f32 = logits.iter().map(|&l| if l == f32::NEG_INFINITY { 0.0 } else { (l - max).exp() }).sum();
    1.0 / total
}
