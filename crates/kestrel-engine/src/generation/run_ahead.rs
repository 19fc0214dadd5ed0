//! The generation loop's policies for a sequence that decodes alone, which a batched step would
//! serve no better (nothing shares its reads of the weights) and worse (the host would wait for
//! each token before the device starts the next):
//!
//! - **Run ahead**: with nothing to compute on the host between steps (`can_run_ahead`), its
//!   decode steps are submitted up to `run_ahead` ahead, each fed the token the previous one
//!   sampled on the device, and only the token ids come back. While token i is read, steps up to
//!   i + ahead - 1 are already submitted, so the device never waits for the host. A stop or an
//!   abort discards the steps run ahead: their KV rows lie past the tokens its slot keeps, and
//!   are overwritten later.
//! - **A device mask**: a constrained output on the GPU, without logprobs, goes one step at a
//!   time; the host computes the step's token mask while the device runs it, then the mask goes
//!   up and the device samples under it, so only the token comes back.
//!
//! Both sample with the model's own sampler, with the draw numbers a batched step would use.

use kestrel_model::{DecodeInput, ModelError, StepOutput};
use kestrel_ops::params::Penalties;
use web_time::Instant;

use super::generator::Generator;
use super::result::FinishReason;
use super::sequence::{BatchStep, SequenceEvent, SequenceId};

impl Generator {
    /// One step of the only sequence, which decodes: run ahead, under a device mask, or, where
    /// neither applies (logprobs or penalties read or write per step; a constraint on the CPU),
    /// a batched step of one.
    pub(super) async fn step_alone(&mut self, step: &mut BatchStep) {
        let seq = &self.sequences[0];
        let device_mask = seq.matcher.is_some() && seq.options.logprobs == 0 && self.model.token_mask_words().is_some();
        let outcome = if seq.can_run_ahead() {
            self.run_ahead(&mut step.events).await
        } else if device_mask {
            self.masked_on_device(&mut step.events).await
        } else {
            return self.step_batch(self.model.max_chunk(), step).await;
        };
        (step.sequences, step.decoding, step.rows) = (1, 1, 1);
        match outcome {
            Ok(None) => {}
            Ok(Some(reason)) => self.end_sequences(vec![(0, Ok(reason))], &mut step.events),
            Err(e) => self.end_sequences(vec![(0, Err(e))], &mut step.events),
        }
    }

    /// Keeps `run_ahead` decode steps in flight and reads the first one's token.
    async fn run_ahead(&mut self, events: &mut Vec<(SequenceId, SequenceEvent)>) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.model.context_length();
        let seq = &mut self.sequences[0];
        if !seq.owns_sampler {
            self.model.set_sampling(&seq.sampling, &Penalties::default(), Vec::new())?;
            seq.owns_sampler = true;
        }
        let next = seq.next.ok_or_else(|| ModelError::InvalidOption { name: "step", reason: "a sequence with no token to run".into() })?;
        while (seq.in_flight as usize) < self.run_ahead {
            let ahead = seq.in_flight;
            let (pos, draw) = (seq.pos + ahead as usize, seq.draws + ahead);
            // The step samples token `draw`, at position `pos`: both must be allowed.
            if draw as usize >= seq.options.max_tokens || pos >= max_ctx {
                break;
            }
            let input = if ahead == 0 { DecodeInput::Token(next) } else { DecodeInput::Sampled };
            self.model.submit_decode(seq.slot, input, pos, draw, &StepOutput::Token)?;
            seq.in_flight += 1;
        }
        if seq.in_flight == 0 {
            // `take_token` ends a sequence before its next token would pass either bound.
            return Err(ModelError::InvalidOption { name: "step", reason: "a sequence past its max_tokens or context".into() });
        }
        let wait = Instant::now();
        let token = self.model.read_token(seq.draws).await?;
        seq.host_wait += wait.elapsed();
        seq.in_flight -= 1;
        seq.pos += 1;
        seq.take_token(token, None, self.model.tokenizer(), max_ctx, events)
    }

    /// One constrained decode step: its logits stay on the device while the host computes the
    /// mask, then the device samples under it.
    async fn masked_on_device(&mut self, events: &mut Vec<(SequenceId, SequenceEvent)>) -> Result<Option<FinishReason>, ModelError> {
        let max_ctx = self.model.context_length();
        let words = self.model.token_mask_words();
        let seq = &mut self.sequences[0];
        let policy = seq.penalties();
        if !seq.owns_sampler {
            self.model.set_sampling(&seq.sampling, &policy.penalties, policy.entries(&seq.history))?;
            seq.owns_sampler = true;
        } else if policy.is_active() {
            self.model.set_penalties(&policy.penalties, policy.entries(&seq.history))?;
        }
        let (Some(next), Some(matcher), Some(words)) = (seq.next, seq.matcher.as_mut(), words) else {
            return Err(ModelError::InvalidOption { name: "step", reason: "a device mask needs a constraint, a token and a GPU".into() });
        };
        self.model.submit_decode(seq.slot, DecodeInput::Token(next), seq.pos, seq.draws, &StepOutput::Logits)?;
        let wait = Instant::now();
        matcher.prepare()?;
        self.model.set_token_mask(Some(&matcher.mask_words(words)?))?;
        self.model.submit_sample(seq.draws)?;
        let token = self.model.read_token(seq.draws).await?;
        seq.host_wait += wait.elapsed();
        seq.pos += 1;
        seq.take_token(token, None, self.model.tokenizer(), max_ctx, events)
    }

    /// Reads the tokens of the steps a sequence ran ahead while it was alone, before it shares a
    /// step: they are its next tokens. One that ends it discards the rest.
    pub(super) async fn read_in_flight(&mut self, events: &mut Vec<(SequenceId, SequenceEvent)>) {
        let max_ctx = self.model.context_length();
        let mut ended = Vec::new();
        for (i, seq) in self.sequences.iter_mut().enumerate() {
            while seq.in_flight > 0 {
                seq.in_flight -= 1;
                let outcome = match self.model.read_token(seq.draws).await {
                    Ok(token) => {
                        seq.pos += 1;
                        seq.take_token(token, None, self.model.tokenizer(), max_ctx, events)
                    }
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(None) => {}
                    Ok(Some(reason)) => {
                        ended.push((i, Ok(reason)));
                        seq.in_flight = 0;
                    }
                    Err(e) => {
                        ended.push((i, Err(e)));
                        seq.in_flight = 0;
                    }
                }
            }
        }
        self.end_sequences(ended, events);
    }
}
