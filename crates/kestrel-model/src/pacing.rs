//! Bounding how long one GPU submission holds the device. The browser's GPU process also draws
//! the page, and it cannot cut into a command buffer: a whole prefill chunk submitted at once
//! (every layer of up to 128 tokens) can hold it for many frames. With a budget, a chunk's layers
//! go in pieces, each submitted once the previous one has finished, as many layers a piece as the
//! last piece's time per layer says fit the budget (one at least; the first piece ever is one).

use std::time::Duration;

use crate::ModelError;

/// The largest budget `Model::set_submit_budget` takes: beyond a second a submission is no
/// longer bounded in any sense a page would notice.
pub const MAX_SUBMIT_BUDGET: Duration = Duration::from_secs(1);

/// A budget in milliseconds as the CLI and the npm package take it: 0 is none, else above 0 and
/// at most `MAX_SUBMIT_BUDGET`.
pub fn submit_budget_from_ms(ms: f64) -> Result<Option<Duration>, ModelError> {
    if ms == 0.0 {
        return Ok(None);
    }
    let budget = Duration::try_from_secs_f64(ms / 1e3).map_err(|_| bad_budget())?;
    check_budget(budget).map(Some)
}

/// `budget` if it is above 0 and at most `MAX_SUBMIT_BUDGET`.
pub(crate) fn check_budget(budget: Duration) -> Result<Duration, ModelError> {
    if budget.is_zero() || budget > MAX_SUBMIT_BUDGET {
        return Err(bad_budget());
    }
    Ok(budget)
}

fn bad_budget() -> ModelError {
    ModelError::InvalidOption {
        name: "submit_budget_ms",
        reason: format!("must be 0 (none), or above 0 and at most {} ms", MAX_SUBMIT_BUDGET.as_millis()),
    }
}

/// Cuts prompt chunks into pieces that each take at most `budget` on the device, and keeps
/// what the pieces measured for the generation's timings.
#[derive(Clone, Debug)]
pub struct SubmitPacer {
    budget: Duration,
    /// The device time of one layer of a chunk, from the last piece (None before the first).
    per_layer: Option<Duration>,
    /// Since the last `take_report`: pieces submitted and the longest one.
    pieces: usize,
    longest: Duration,
}

/// What a generation's paced prefill measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SubmitReport {
    pub pieces: usize,
    pub longest: Duration,
}

impl SubmitPacer {
    pub fn new(budget: Duration) -> Self {
        Self { budget, per_layer: None, pieces: 0, longest: Duration::ZERO }
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Layers the next piece takes, of `layers` left: as many as fit the budget at the last
    /// measured time per layer, one at least.
    pub fn layers_per_piece(&self, layers: usize) -> usize {
        let fit = match self.per_layer {
            None => 1,
            Some(t) if t.is_zero() => layers,
            Some(t) => (self.budget.as_secs_f64() / t.as_secs_f64()) as usize,
        };
        fit.clamp(1, layers.max(1))
    }

    /// Records a piece of `layers` layers that took `elapsed` from its submit to its end.
    pub fn observe(&mut self, layers: usize, elapsed: Duration) {
        self.per_layer = Some(elapsed / layers.max(1) as u32);
        self.pieces += 1;
        self.longest = self.longest.max(elapsed);
    }

    /// The pieces since the last report, and the longest of them; starts a new report.
    pub fn take_report(&mut self) -> SubmitReport {
        let report = SubmitReport { pieces: self.pieces, longest: self.longest };
        self.pieces = 0;
        self.longest = Duration::ZERO;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn budgets_in_ms_are_checked() {
        assert_eq!(submit_budget_from_ms(0.0).unwrap(), None);
        assert_eq!(submit_budget_from_ms(8.5).unwrap(), Some(Duration::from_micros(8500)));
        assert_eq!(submit_budget_from_ms(1000.0).unwrap(), Some(MAX_SUBMIT_BUDGET));
        for bad in [-1.0, 1000.5, f64::NAN, f64::INFINITY] {
            assert!(submit_budget_from_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_first_piece_is_one_layer() {
        assert_eq!(SubmitPacer::new(8 * MS).layers_per_piece(30), 1);
    }

    #[test]
    fn pieces_fill_the_budget_at_the_measured_time_per_layer() {
        let mut pacer = SubmitPacer::new(8 * MS);
        pacer.observe(1, 3 * MS);
        assert_eq!(pacer.layers_per_piece(30), 2, "8 ms / 3 ms a layer");
        pacer.observe(2, MS);
        assert_eq!(pacer.layers_per_piece(30), 16, "8 ms / 0.5 ms a layer");
        assert_eq!(pacer.layers_per_piece(5), 5, "no more than the layers left");
        pacer.observe(1, 20 * MS);
        assert_eq!(pacer.layers_per_piece(30), 1, "a layer over the budget still goes, alone");
    }

    #[test]
    fn the_report_counts_pieces_and_keeps_the_longest_until_taken() {
        let mut pacer = SubmitPacer::new(8 * MS);
        pacer.observe(1, 3 * MS);
        pacer.observe(2, 7 * MS);
        pacer.observe(2, 5 * MS);
        assert_eq!(pacer.take_report(), SubmitReport { pieces: 3, longest: 7 * MS });
        assert_eq!(pacer.take_report(), SubmitReport::default());
        // The time per layer outlives the report: the next prompt starts from it.
        assert_eq!(pacer.layers_per_piece(30), 3);
    }
}
