//! One sequence's draft state: how long its next draft should be, what it accepted so far, and
//! whether speculation pays for it.
//!
//! The draft length is chosen to maximise the expected tokens per second of a step. With a
//! per-token acceptance rate α, a draft of k tokens gives E(k) = 1 + α + ... + α^k tokens (the
//! kept run and the target's own token) and costs, in plain steps, 1 + (c + β)·k: c is a drafted
//! token's cost (the draft model's step; about 0 for prompt lookup) and β a verification row's
//! cost beyond a plain step's. So the best k maximises E(k) / (1 + (c + β)·k), and k = 0, plain
//! decoding, wins where the drafts fall too often for their cost: speculation switches itself off.
//! - α is estimated from the verdicts, recent ones weighing most (each old count decays by
//!   `DECAY` a verification), from an even prior.
//! - c and β are measured on the steps the sequence runs alone: a plain step's time, a drafted
//!   token's time, and a verification's time beyond its draft's and a plain step's, per row
//!   (moving averages). Until a plain step is timed (its first decode steps speculate; one plain
//!   step follows its third speculative one) the priors hold: c = 0, β = `PRIOR_ROW_COST`.
//! - The model can be wrong where costs hide from it (a draft model's pass that proposes nothing
//!   above `p_min`, the host's work on a draft), so the realized speed decides too: seconds per
//!   generated token of its speculative steps since the last pause (drafting attempts that
//!   proposed nothing included; older steps fade by `KEEP_SPECULATIVE` a step) against its plain
//!   steps'. It is a ratio of sums, not an average of ratios: one pass that proposed nothing,
//!   amid drafts that stand, does not tip it alone.
//! - A step whose draft model first caught up on a pause's tokens judges nothing: that cost is
//!   paid once the pause ends, whatever follows.
//! - What speculating has cost is kept as a balance: the seconds its steps saved against plain
//!   steps giving the same tokens (a loss, negative; the catch-ups included). No probe starts
//!   while the losses exceed `LOSS_BUDGET` of the sequence's decoding so far (in plain steps'
//!   time): each plain step earns a little back. A draft model's probes cost their pause's tokens
//!   run into it (a few per cent of the pause's time at 1.5B with a 0.5B draft, whatever its
//!   length), so without the budget a request whose drafts never pay lost more than 5%.
//! - Where k = 0 wins, or speculating measures slower, it decodes plainly for a while (8 steps,
//!   doubling up to 128 while it keeps losing) and then probes with a draft of at least one
//!   token, so the estimates can recover: a request that drafts badly pays one short probe per
//!   pause.

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

/// Speculative steps after which a sequence with no plain step timed yet runs one.
const BASELINE_AFTER: u32 = 3;
/// The first pause where plain decoding wins, in plain steps; each pause in a row doubles.
const FIRST_PAUSE: u32 = 8;
const LONGEST_PAUSE: u32 = 128;
/// Weight of the newest sample in the moving averages of times.
const NEWEST: f64 = 0.25;
/// What the realized speed's earlier steps count for at the next speculative step.
const KEEP_SPECULATIVE: f64 = 0.9;
/// What each earlier verdict counts for at the next verification.
const DECAY: f64 = 0.8;
/// A verification row's cost beyond a plain step's, before one is measured: the CPU backend
/// at 1.5B measured about 0.05 a row; a small model pays more per row, which the measure finds.
const PRIOR_ROW_COST: f64 = 0.1;
/// What speculating may lose before a probe, as a share of the sequence's decoding time so far
/// (a probe may lose as much again: the bound is 5%).
const LOSS_BUDGET: f64 = 0.02;

/// What one step the sequence ran alone measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTime {
    /// The whole step: drafting, the target's pass, the verdicts.
    pub total: Duration,
    /// Of it, drafting.
    pub drafting: Duration,
    /// Of the drafting, the draft model's token-by-token passes, and how many ran.
    pub proposing: Duration,
    pub proposals: usize,
    /// Tokens drafted; a plain step drafted nothing and made no drafting pass.
    pub drafted: usize,
    /// Tokens the step gave the sequence.
    pub tokens: usize,
    /// Whether the draft model first caught up on a pause's tokens (`Draft::caught_up`).
    pub caught_up: bool,
}

#[derive(Clone, Debug)]
pub struct SequenceDraft {
    max: usize,
    pub stats: SpeculativeStats,
    /// Tokens of the sequence whose KV rows the draft model's slot holds (unused by lookup).
    pub draft_pos: usize,
    /// Decayed counts of drafted tokens kept and of drafts that fell: α's evidence.
    kept: f64,
    fell: f64,
    /// Moving averages: a plain step's seconds, a drafted token's seconds, and a verification
    /// row's cost beyond a plain step as a share of one (β).
    plain: Option<f64>,
    draft_token: Option<f64>,
    row_cost: Option<f64>,
    /// The speculative steps' seconds and the tokens they gave since the last pause (fading).
    speculative: Option<(f64, f64)>,
    /// Plain steps left before the next draft, and the next pause's length.
    paused: u32,
    next_pause: u32,
    speculative_steps: u32,
    /// Seconds speculating saved (negative: lost) against plain steps, and the plain steps'
    /// seconds of the tokens decoded so far.
    balance: f64,
    decoded: f64,
}

impl SequenceDraft {
    /// A sequence's state under an engine drafting up to `max` tokens; the draft model's slot
    /// holds its first `draft_pos` tokens.
    pub fn new(max: usize, draft_pos: usize) -> Self {
        Self {
            max,
            stats: SpeculativeStats::default(),
            draft_pos,
            kept: 0.0,
            fell: 0.0,
            plain: None,
            draft_token: None,
            row_cost: None,
            speculative: None,
            paused: 0,
            next_pause: FIRST_PAUSE,
            speculative_steps: 0,
            balance: 0.0,
            decoded: 0.0,
        }
    }

    /// Most tokens to draft for the next step: 0 while paused or over the loss budget, else the
    /// best length (at least one: after a pause, a probe).
    pub fn wanted(&self) -> usize {
        if self.paused > 0 || self.balance < -LOSS_BUDGET * self.decoded {
            0
        } else {
            self.best_length().max(1)
        }
    }

    /// The estimated per-token acceptance rate.
    fn acceptance(&self) -> f64 {
        (self.kept + 1.0) / (self.kept + self.fell + 2.0)
    }

    /// The draft length with the most expected tokens per plain step's time (0: plain decoding).
    fn best_length(&self) -> usize {
        let alpha = self.acceptance();
        let token_cost = match (self.draft_token, self.plain) {
            (Some(d), Some(p)) if p > 0.0 => d / p,
            _ => 0.0,
        };
        let per_row = token_cost + self.row_cost.unwrap_or(PRIOR_ROW_COST);
        let (mut best, mut best_rate, mut expected, mut run) = (0, 1.0, 1.0, 1.0);
        for k in 1..=self.max {
            run *= alpha;
            expected += run;
            let rate = expected / (1.0 + per_row * k as f64);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        best
    }

    /// A verification's verdicts: `accepted` of `drafted` tokens stood.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.drafted += drafted as u64;
        self.stats.accepted += accepted as u64;
        self.stats.verifications += 1;
        self.kept = self.kept * DECAY + accepted as f64;
        self.fell = self.fell * DECAY + f64::from(u8::from(accepted < drafted));
    }

    /// The time of a step the sequence ran alone: it updates the cost estimates, and pauses
    /// speculation where plain decoding now wins.
    pub fn record_time(&mut self, step: StepTime) {
        let average = |slot: &mut Option<f64>, sample: f64| *slot = Some(slot.map_or(sample, |a| a + NEWEST * (sample - a)));
        let total = step.total.as_secs_f64();
        if step.drafted == 0 && step.proposals == 0 {
            average(&mut self.plain, total / step.tokens.max(1) as f64);
            self.decoded += total;
            self.paused = self.paused.saturating_sub(1);
            return;
        }
        self.speculative_steps += 1;
        if let Some(plain) = self.plain {
            let as_plain = plain * step.tokens as f64;
            self.balance += as_plain - total;
            self.decoded += as_plain;
        }
        if step.caught_up {
            // Counted, every probe measured slower than plain and each pause doubled the next.
            return;
        }
        let (seconds, tokens) = self.speculative.unwrap_or_default();
        self.speculative = Some((seconds * KEEP_SPECULATIVE + total, tokens * KEEP_SPECULATIVE + step.tokens as f64));
        if step.proposals > 0 {
            average(&mut self.draft_token, step.proposing.as_secs_f64() / step.proposals as f64);
        }
        match self.plain {
            Some(plain) if plain > 0.0 && step.drafted > 0 => {
                let verification = total - step.drafting.as_secs_f64();
                average(&mut self.row_cost, ((verification - plain) / (plain * step.drafted as f64)).max(0.0));
            }
            // (At or after: the third may have been a catch-up, which judges nothing.)
            None if self.speculative_steps >= BASELINE_AFTER => self.paused = 1,
            _ => {}
        }
        self.pause_if_plain_wins();
    }

    /// A plain step the sequence ran beside others (its time is theirs too): only the pause
    /// counts down.
    pub fn plain_step(&mut self) {
        self.decoded += self.plain.unwrap_or(0.0);
        self.paused = self.paused.saturating_sub(1);
    }

    /// After a verification beside others, where no time is the sequence's own.
    pub fn verified_in_batch(&mut self) {
        self.pause_if_plain_wins();
    }

    fn pause_if_plain_wins(&mut self) {
        if self.paused > 0 {
            return;
        }
        let slower = matches!((self.speculative, self.plain), (Some((seconds, tokens)), Some(plain)) if seconds > plain * tokens);
        if slower || self.best_length() == 0 {
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
            // The next probe is judged on its own, not on the average of what no longer holds.
            self.speculative = None;
        } else {
            self.next_pause = FIRST_PAUSE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(total_ms: u64, drafting_ms: u64, proposals: usize, drafted: usize, tokens: usize) -> StepTime {
        let ms = Duration::from_millis;
        StepTime {
            total: ms(total_ms),
            drafting: ms(drafting_ms),
            proposing: ms(drafting_ms),
            proposals,
            drafted,
            tokens,
            caught_up: false,
        }
    }

    fn plain(ms: u64) -> StepTime {
        StepTime { total: Duration::from_millis(ms), tokens: 1, ..StepTime::default() }
    }

    #[test]
    fn drafts_are_long_while_they_stand_and_cost_little() {
        let mut d = SequenceDraft::new(16, 0);
        assert!(d.wanted() >= 1, "it speculates from the first decode step");
        for _ in 0..10 {
            d.record(8, 8);
        }
        // Lookup: drafting costs nothing, a row 5% of a plain step; α about 0.99.
        d.record_time(plain(100));
        d.record_time(spec(140, 0, 0, 8, 9));
        assert_eq!(d.wanted(), 16, "long drafts pay: {d:?}");
        assert_eq!(d.stats, SpeculativeStats { drafted: 80, accepted: 80, verifications: 10 });
    }

    #[test]
    fn a_costly_draft_model_drafts_short_and_plain_decoding_wins_where_drafts_fall() {
        let mut d = SequenceDraft::new(16, 0);
        for _ in 0..10 {
            d.record(4, 3);
        }
        // A draft token at 40% of a plain step: with α about 0.75 a few tokens pay, not 16.
        d.record_time(plain(100));
        d.record_time(spec(300, 160, 4, 4, 4));
        let k = d.wanted();
        assert!((1..=4).contains(&k), "a short draft: {k} ({d:?})");
        // Now every draft falls at once: plain decoding wins, and a pause follows.
        for _ in 0..10 {
            d.record(k, 0);
        }
        d.record_time(spec(300, 160, 4, 4, 1));
        assert_eq!(d.wanted(), 0, "paused: {d:?}");
        for _ in 0..FIRST_PAUSE {
            assert_eq!(d.wanted(), 0);
            d.record_time(plain(100));
        }
        // Its losses (200 ms against 100 saved) exceed the budget: plain steps earn it back first.
        let mut earning = 0;
        while d.wanted() == 0 {
            d.record_time(plain(100));
            earning += 1;
        }
        assert!(earning > 0, "{d:?}");
        assert_eq!(d.wanted(), 1, "a probe of one token after the pause");
        d.record(1, 0);
        d.record_time(spec(150, 40, 1, 1, 1));
        assert_eq!(d.paused, 2 * FIRST_PAUSE, "the second pause in a row is twice as long");
    }

    #[test]
    fn speculation_pauses_where_it_measures_slower_whatever_the_model_says() {
        let mut d = SequenceDraft::new(8, 0);
        for _ in 0..10 {
            d.record(2, 2);
        }
        d.record_time(plain(100));
        assert!(d.wanted() > 0);
        // A draft model whose passes propose nothing above p_min: 2 passes, no draft, 1 token
        // in 180 ms against 100 for a plain step.
        d.record_time(spec(180, 80, 2, 0, 1));
        assert_eq!(d.wanted(), 0, "slower than plain: paused ({d:?})");
    }

    #[test]
    fn the_first_decode_steps_speculate_then_one_plain_step_times_the_baseline() {
        let mut d = SequenceDraft::new(4, 0);
        for _ in 0..BASELINE_AFTER {
            assert!(d.wanted() > 0);
            d.record(2, 2);
            d.record_time(spec(50, 0, 0, 2, 3));
        }
        assert_eq!(d.wanted(), 0, "one plain step for the baseline");
        d.record_time(plain(40));
        assert!(d.wanted() > 0);
    }

    #[test]
    fn the_baseline_follows_where_the_third_speculative_step_was_a_catch_up() {
        let mut d = SequenceDraft::new(4, 0);
        for _ in 1..BASELINE_AFTER {
            d.record(2, 2);
            d.record_time(spec(50, 20, 2, 2, 3));
        }
        // A step beside other sequences, then one that caught the draft model up on it.
        d.plain_step();
        d.record(2, 2);
        d.record_time(StepTime { caught_up: true, ..spec(80, 50, 2, 2, 3) });
        assert!(d.wanted() > 0);
        d.record(2, 2);
        d.record_time(spec(50, 20, 2, 2, 3));
        assert_eq!(d.wanted(), 0, "one plain step for the baseline ({d:?})");
    }

    #[test]
    fn a_probe_that_catches_up_on_its_pause_is_judged_by_the_step_after_it() {
        let mut d = SequenceDraft::new(8, 0);
        d.record_time(plain(100));
        // Drafts that paid (3 tokens in 150 ms), then fall: slower than plain, so a pause.
        for _ in 0..10 {
            d.record(2, 2);
            d.record_time(spec(150, 60, 2, 2, 3));
        }
        while d.wanted() > 0 {
            d.record(2, 0);
            d.record_time(spec(250, 100, 2, 2, 1));
        }
        let pause = |d: &mut SequenceDraft| {
            while d.wanted() == 0 {
                d.record_time(plain(100));
            }
        };
        pause(&mut d);
        // The probe's pass first ran the pause's tokens into the draft model: slower than plain,
        // but that says nothing of drafting from here on.
        let probe = StepTime { caught_up: true, ..spec(260, 160, 2, 2, 1) };
        d.record(2, 0);
        d.record_time(probe);
        assert!(d.wanted() > 0, "not paused by its catch-up ({d:?})");
        // The step after it is judged: still slower, so a pause twice as long.
        d.record(2, 0);
        d.record_time(spec(250, 100, 2, 2, 1));
        assert_eq!(d.paused, 2 * FIRST_PAUSE, "{d:?}");
        pause(&mut d);
        // The drafts stand again: after the probe, 3 tokens in 150 ms against 100 for one plain.
        for _ in 0..10 {
            d.record(2, 2);
        }
        d.record_time(probe);
        d.record_time(spec(150, 60, 2, 2, 3));
        assert!(d.wanted() > 0, "speculating pays again ({d:?})");
        assert_eq!(d.next_pause, FIRST_PAUSE, "a pause after a win starts short again");
    }

    #[test]
    fn a_draft_model_that_never_pays_costs_at_most_the_budget() {
        // Qwen2.5-Coder 1.5B with its 0.5B on 2 cores, on prose: a plain step 55 ms, a draft
        // pass 28 ms that proposes nothing above p_min, and each token of the pause before it
        // 3.5 ms more to run into the draft model first.
        let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
        let mut d = SequenceDraft::new(16, 0);
        let (mut spent, mut plain_time, mut behind, mut probes) = (0.0, 0.0, 0.0, 0);
        for _ in 0..4000 {
            plain_time += 55.0;
            if d.wanted() == 0 {
                d.record_time(plain(55));
                spent += 55.0;
                behind += 1.0;
                continue;
            }
            let drafting = 28.0 + 3.5 * behind;
            let step = StepTime {
                total: ms(55.0 + drafting),
                drafting: ms(drafting),
                proposing: ms(drafting),
                proposals: 1,
                tokens: 1,
                caught_up: behind > 1.0,
                ..StepTime::default()
            };
            d.record_time(step);
            spent += 55.0 + drafting;
            (behind, probes) = (0.0, probes + 1);
        }
        let loss = spent / plain_time - 1.0;
        assert!(loss <= 0.05 && loss > 0.0, "speculating lost {:.1}% ({probes} probes)", 100.0 * loss);
        assert!(probes >= 5, "it keeps probing now and then: {probes}");
    }
}
