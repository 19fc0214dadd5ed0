//! The generation loop's side of speculative decoding (`speculation`): the drafts of a step's
//! decoding sequences, and the verdicts on their verification rows.

use kestrel_model::{Model, ModelError};
use kestrel_ops::reference::sample;

use super::generator::Generator;
use super::host_sampling::HostSampler;
use super::result::FinishReason;
use super::sequence::{SequenceEvent, SequenceId};
use super::speculation::{
    lookup_draft, verify, DraftDistribution, DraftModel, DraftRequest, SpeculativeOptions, Verdict, MAX_SPECULATIVE_BATCH,
};

/// How an engine speculates: its options, and its draft model where it has one.
pub(super) struct Speculation {
    pub options: SpeculativeOptions,
    pub draft: Option<DraftModel>,
}

/// One sequence's draft for a step: the tokens, and the distribution each was drawn from.
#[derive(Debug, Default)]
pub(super) struct StepDraft {
    pub tokens: Vec<u32>,
    pub distributions: Vec<DraftDistribution>,
    /// Tokens of the sequence and its draft whose KV rows the draft model's slot holds.
    pub draft_cached: Option<usize>,
    /// The draft model's token-by-token passes it took part in, and their time.
    pub proposals: usize,
    pub proposing: std::time::Duration,
    /// Whether the draft model caught up on a pause's tokens first (`Draft::caught_up`).
    pub caught_up: bool,
}

impl Generator {
    /// Drafts for this step, one per running sequence (empty where it does not speculate now):
    /// every decoding sequence whose request lets it, while at most `MAX_SPECULATIVE_BATCH` decode.
    /// Drafting never fails a sequence: where it fails (a constraint's error, the draft model's),
    /// the sequence steps plainly, and its own sampling meets its own errors.
    pub(super) async fn draft_step(&mut self) -> Vec<StepDraft> {
        let mut drafts: Vec<StepDraft> = self.sequences.iter().map(|_| StepDraft::default()).collect();
        let Some(spec) = self.speculation.as_mut() else { return drafts };
        let decoding = self.sequences.iter().filter(|s| s.next.is_some()).count();
        let (max_ctx, max_rows) = (self.model.context_length(), self.model.max_verify_rows());
        // (sequence index, most tokens to draft)
        let mut wanted = Vec::new();
        for (i, seq) in self.sequences.iter_mut().enumerate() {
            let (Some(_), Some(state)) = (seq.next, seq.draft.as_mut()) else { continue };
            if decoding > MAX_SPECULATIVE_BATCH || state.wanted() == 0 {
                continue;
            }
            // The step runs `next` at `pos` and the draft after it; each drafted token that
            // stands is a generated token, and one more comes from the target.
            let left = seq.options.max_tokens.saturating_sub(seq.output.generated.len() + 1);
            let room = max_ctx.saturating_sub(seq.pos + 1);
            let max = state.wanted().min(left).min(room).min(max_rows.saturating_sub(1));
            if max > 0 {
                wanted.push((i, max));
            }
        }
        let tokenizer = self.model.tokenizer();
        let mut for_model = Vec::new();
        for &(i, max) in &wanted {
            let seq = &mut self.sequences[i];
            let mut tokens = if spec.options.lookup { lookup_draft(&seq.history, max) } else { Vec::new() };
            if let Some(end) = tokens.iter().position(|&t| tokenizer.is_eog(t)) {
                tokens.truncate(end + 1);
            }
            if let Some(matcher) = seq.matcher.as_mut() {
                tokens.truncate(matcher.allowed_prefix(&tokens).unwrap_or(0));
            }
            if tokens.is_empty() {
                for_model.push((i, max));
            } else {
                drafts[i].distributions = vec![None; tokens.len()];
                drafts[i].tokens = tokens;
            }
        }
        let Some(draft_model) = spec.draft.as_mut() else { return drafts };
        if for_model.is_empty() {
            return drafts;
        }
        let p_min = spec.options.p_min;
        let mut requests: Vec<DraftRequest<'_>> = Vec::new();
        let mut indices = Vec::new();
        for (i, seq) in self.sequences.iter_mut().enumerate() {
            let Some(&(_, max)) = for_model.iter().find(|(j, _)| *j == i) else { continue };
            let cached = seq.draft.as_ref().map_or(0, |d| d.draft_pos);
            requests.push(DraftRequest {
                slot: seq.slot,
                history: &seq.history,
                cached,
                max,
                params: seq.sampling,
                draw: seq.draws,
                matcher: seq.matcher.as_mut(),
                p_min,
            });
            indices.push(i);
        }
        // The draft's rows below each sequence's `draft_pos` are untouched by a failed pass.
        let Ok(proposed) = draft_model.draft(&mut requests).await else { return drafts };
        for (i, d) in indices.into_iter().zip(proposed) {
            // A draft that proposed nothing still ran the sequence's tokens into the draft's
            // slot (else the next draft runs them again, one more each time); one that proposed
            // some learns what stands at its verification (`take_verified`).
            if let (true, Some(state)) = (d.tokens.is_empty(), self.sequences[i].draft.as_mut()) {
                state.draft_pos = d.cached;
            }
            drafts[i] = StepDraft {
                tokens: d.tokens,
                distributions: d.distributions,
                draft_cached: Some(d.cached),
                proposals: d.proposals,
                proposing: d.proposing,
                caught_up: d.caught_up,
            };
        }
        drafts
    }

    /// Prefills the draft model with the prompts this step finishes (`plan`'s rows that sample
    /// and are not decoding), before the target's pass: see `DraftModel::prefill`. A failure
    /// names the sequence it failed.
    pub(super) async fn prefill_drafts(&mut self, plan: &[(usize, Vec<u32>, bool)]) -> Result<(), (usize, ModelError)> {
        let Some(draft_model) = self.speculation.as_mut().and_then(|s| s.draft.as_mut()) else { return Ok(()) };
        for &(i, _, samples) in plan {
            let seq = &mut self.sequences[i];
            let (false, true, Some(state)) = (seq.next.is_some(), samples, seq.draft.as_mut()) else { continue };
            state.draft_pos = draft_model.prefill(seq.slot, &seq.prompt, state.draft_pos).await.map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Takes sequence i's verification: `rows` holds the logits of its step's rows (`next`, then
    /// each drafted token), each checked against the drafted token after it; the first that
    /// falls is replaced by the target's own token, and a draft that stands whole gets one more.
    pub(super) fn take_verified(
        &mut self,
        i: usize,
        rows: &[f32],
        draft: &StepDraft,
        events: &mut Vec<(SequenceId, SequenceEvent)>,
    ) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.model.context_length();
        let tokenizer = self.model.tokenizer();
        let seq = &mut self.sequences[i];
        let k = draft.tokens.len();
        let vocab = rows.len() / (k + 1);
        if vocab == 0 || vocab * (k + 1) != rows.len() {
            let reason = format!("a verification of {} rows returned {} logits", k + 1, rows.len());
            return Err(kestrel_gpu::GpuError::Readback(reason).into());
        }
        let before = seq.history.len();
        // `next`'s row is in the cache.
        seq.pos += 1;
        let (mut accepted, mut checked) = (0, 0);
        let mut outcome = None;
        for (j, row) in rows.chunks_exact(vocab).enumerate() {
            let host = HostSampler { options: &seq.options, sampling: &seq.sampling, history: &seq.history, draw: seq.draws };
            let processed = host.processed(row, seq.matcher.as_mut())?;
            checked += usize::from(j < k);
            let (token, stands) = match draft.tokens.get(j) {
                Some(&drafted) => match verify(&processed, &seq.sampling, seq.draws, drafted, &draft.distributions[j]) {
                    Verdict::Accept => (drafted, true),
                    Verdict::Replace(own) => (own, false),
                },
                None => (sample::sample(&processed, &seq.sampling, seq.draws), false),
            };
            accepted += usize::from(stands);
            outcome = seq.take_token(token, Some(row), tokenizer, max_ctx, events)?;
            if outcome.is_some() || !stands {
                break;
            }
            // The drafted token's row is in the cache too.
            seq.pos += 1;
        }
        if let Some(state) = seq.draft.as_mut() {
            // Drafted tokens after the sequence's end were never judged.
            state.record(checked, accepted);
            if let Some(cached) = draft.draft_cached {
                state.draft_pos = cached.min(before + accepted);
            }
        }
        Ok(outcome)
    }

    /// Sets how the engine speculates, with `draft` as its draft model (None: prompt lookup
    /// only), for the sequences added from now on; `clear_speculation` stops it.
    pub fn set_speculation(&mut self, options: SpeculativeOptions, draft: Option<Model>) -> Result<(), ModelError> {
        options.validate()?;
        if !self.sequences.is_empty() {
            return Err(ModelError::InvalidOption { name: "speculative", reason: "cannot change while sequences run".into() });
        }
        if !options.lookup && draft.is_none() {
            return Err(ModelError::InvalidOption { name: "speculative", reason: "needs prompt lookup or a draft model".into() });
        }
        let draft = draft.map(|d| DraftModel::new(d, &self.model)).transpose()?;
        self.speculation = Some(Speculation { options, draft });
        Ok(())
    }

    /// Stops speculating, returning the draft model where there was one.
    pub fn clear_speculation(&mut self) -> Option<Model> {
        self.speculation.take().and_then(|s| s.draft).map(DraftModel::into_model)
    }

    /// How the engine speculates, and its draft model: None without speculation.
    pub fn speculation(&self) -> Option<(SpeculativeOptions, Option<&Model>)> {
        self.speculation.as_ref().map(|s| (s.options, s.draft.as_ref().map(DraftModel::model)))
    }
}
