//! One sequence's draft state: how long its next draft may be, what it accepted so far, and
//! whether speculation pays for it.
//!
//! - **The draft length adapts** to the measured acceptance: a draft that stood whole lets the
//!   next be twice as long (at most the engine's `draft_max`); one that fell after m tokens
//!   makes the next m + 1 long. Drafts start at `FIRST_DRAFT` tokens. A verification row costs
//!   compute (at 135M on the CPU a step of 15 rows took 6.6 times a one-row step), so a run of
//!   failures probes with short drafts, and a copied run (an edit, a quote) grows them fast.
//! - **Speculation pauses itself where it does not pay.** A sequence that decodes alone times
//!   its steps: seconds per token of its plain steps and of its speculative ones (moving
//!   averages). When speculating measures slower, it decodes plainly for a while (8 steps,
//!   doubling up to 128 while it keeps measuring slower) and then tries again, so a prose
//!   request that drafts badly pays at most one probe in every pause. A sequence that has
//!   speculated from its first decode step runs one plain step after its third speculative
//!   one, for the baseline.

use std::time::Duration;

/// Counters of one sequence's speculation (reported with its generation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpeculativeStats {
    /// Tokens drafted and verified.
    pub drafted: u64,
    /// Of them, the ones the target kept.
    pub accepted: u64,
    /// Target steps that verified a draft (each also gave one token of the target's own).
    pub verifications: u64,
}

impl SpeculativeStats {
    /// Tokens gained per target step that verified: the accepted ones plus the target's own.
    pub fn tokens_per_step(&self) -> f64 {
        if self.verifications == 0 {
            return 1.0;
        }
        (self.accepted + self.verifications) as f64 / self.verifications as f64
    }

    pub fn add(&mut self, other: &SpeculativeStats) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.verifications += other.verifications;
    }
}

/// Speculative steps after which a sequence with no plain step yet runs one, for the baseline.
const BASELINE_AFTER: u32 = 3;
/// The first draft's length (at most the engine's `draft_max`).
const FIRST_DRAFT: usize = 4;
/// The first pause after speculation measured slower, in plain steps; each pause in a row doubles.
const FIRST_PAUSE: u32 = 8;
const LONGEST_PAUSE: u32 = 128;
/// Weight of the newest step in the moving averages of seconds per token.
const NEWEST: f64 = 0.25;

#[derive(Clone, Debug)]
pub struct SequenceDraft {
    /// Tokens the next draft may have (adapts; 1 to `max`).
    len: usize,
    max: usize,
    pub stats: SpeculativeStats,
    /// Tokens of the sequence whose KV rows the draft model's slot holds (unused by lookup).
    pub draft_pos: usize,
    /// Plain steps left before the next draft.
    paused: u32,
    /// The next pause's length.
    next_pause: u32,
    /// Moving averages of seconds per token: plain steps, speculative steps.
    plain: Option<f64>,
    speculative: Option<f64>,
    /// Speculative steps timed so far.
    speculative_steps: u32,
}

impl SequenceDraft {
    /// A sequence's state under an engine drafting up to `max` tokens; the draft model's slot
    /// holds its first `draft_pos` tokens.
    pub fn new(max: usize, draft_pos: usize) -> Self {
        Self {
            len: FIRST_DRAFT.min(max),
            max,
            stats: SpeculativeStats::default(),
            draft_pos,
            paused: 0,
            next_pause: FIRST_PAUSE,
            plain: None,
            speculative: None,
            speculative_steps: 0,
        }
    }

    /// Most tokens to draft for the next step: 0 while paused.
    pub fn wanted(&self) -> usize {
        if self.paused > 0 {
            0
        } else {
            self.len
        }
    }

    /// A verification's verdicts: `accepted` of `drafted` tokens stood.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.drafted += drafted as u64;
        self.stats.accepted += accepted as u64;
        self.stats.verifications += 1;
        self.len = if accepted == drafted { (self.len * 2).min(self.max) } else { accepted + 1 };
    }

    /// The time of a step the sequence ran alone, which gave it `tokens` tokens: a speculative
    /// one (it verified a draft) or a plain one. Pauses speculation where it measures slower.
    pub fn record_time(&mut self, speculative: bool, elapsed: Duration, tokens: usize) {
        if !speculative {
            self.paused = self.paused.saturating_sub(1);
        }
        if tokens == 0 {
            return;
        }
        let per_token = elapsed.as_secs_f64() / tokens as f64;
        let average = if speculative { &mut self.speculative } else { &mut self.plain };
        *average = Some(average.map_or(per_token, |a| a + NEWEST * (per_token - a)));
        if speculative {
            self.speculative_steps += 1;
            if self.plain.is_none() && self.speculative_steps == BASELINE_AFTER {
                self.paused = 1;
            }
        }
        if let (true, Some(plain), Some(spec)) = (speculative, self.plain, self.speculative) {
            if spec > plain {
                self.paused = self.next_pause;
                self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
                // The next probe starts from this one's measure, not from the average of
                // drafts that may have stopped paying long ago.
                self.speculative = None;
            } else {
                self.next_pause = FIRST_PAUSE;
            }
        }
    }

    /// A plain step the sequence ran beside others (its time is theirs too): only the pause
    /// counts down.
    pub fn plain_step(&mut self) {
        self.paused = self.paused.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_draft_length_doubles_while_drafts_stand_and_follows_the_last_run_when_they_fall() {
        let mut d = SequenceDraft::new(16, 0);
        assert_eq!(d.wanted(), FIRST_DRAFT);
        d.record(4, 4);
        assert_eq!(d.wanted(), 8);
        d.record(8, 8);
        d.record(16, 16);
        assert_eq!(d.wanted(), 16, "capped at the engine's draft_max");
        d.record(16, 5);
        assert_eq!(d.wanted(), 6, "a run of 5 kept: the next draft is 6 long");
        d.record(6, 0);
        assert_eq!(d.wanted(), 1, "never below one token");
        assert_eq!(d.stats, SpeculativeStats { drafted: 4 + 8 + 16 + 16 + 6, accepted: 33, verifications: 5 });
        assert_eq!(SequenceDraft::new(2, 0).wanted(), 2, "at most draft_max from the start");
    }

    #[test]
    fn speculation_measures_a_plain_baseline_and_pauses_where_it_measures_slower() {
        let mut d = SequenceDraft::new(4, 0);
        assert_eq!(d.wanted(), 4, "it speculates from the first decode step");
        d.record(4, 4);
        for _ in 0..BASELINE_AFTER {
            assert_eq!(d.wanted(), 4);
            d.record_time(true, 15 * MS, 3);
        }
        assert_eq!(d.wanted(), 0, "one plain step for the baseline");
        d.record_time(false, 10 * MS, 1);
        // 3 tokens in 15 ms: 5 ms a token, faster than 10.
        assert_eq!(d.wanted(), 4);
        d.record_time(true, 15 * MS, 3);
        assert_eq!(d.wanted(), 4);
        // 1 token in 14 ms (the draft fell): the average, 7.25 ms, still beats plain.
        d.record_time(true, 14 * MS, 1);
        assert_eq!(d.wanted(), 4);
        // 1 token in 40 ms: the average, 15.4 ms, is slower than plain: a pause of 8 plain steps.
        d.record_time(true, 40 * MS, 1);
        assert_eq!(d.wanted(), 0);
        for _ in 0..FIRST_PAUSE {
            assert_eq!(d.wanted(), 0);
            d.record_time(false, 10 * MS, 1);
        }
        assert_eq!(d.wanted(), 4, "it tries again after the pause");
        d.record_time(true, 30 * MS, 1);
        assert_eq!(d.paused, 2 * FIRST_PAUSE, "the second pause in a row is twice as long");
    }
}
