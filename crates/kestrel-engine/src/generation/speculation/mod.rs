//! Speculative decoding: several tokens for one read of the weights. A decoding sequence's next
//! token runs together with a draft of the tokens that may follow it, as one multi-row step of
//! the target (`BatchRow::verify`, the batched products that read each weight once for all the
//! rows); each row's logits check the drafted token after it (`verify.rs`), the longest run that
//! stands is kept, plus one token of the target's own. The KV rows of the drafted tokens that
//! fall lie past the sequence's position and are overwritten by its next step: that is the
//! rollback, for the target's cache and the draft model's alike.
//!
//! Drafts come from the sequence itself (prompt lookup, `lookup.rs`) or from a smaller model with
//! the target's vocabulary (`draft_model.rs`). Each sequence keeps its own draft state
//! (`SequenceDraft`): the draft length is the one its measured acceptance and costs make
//! fastest, and plain decoding where none pays (`state.rs`).
//!
//! Where it lives in the generation loop: `Generator::step_batch` drafts for every decoding
//! sequence that speculates, puts its verification rows into the step beside the other sequences'
//! rows, and takes the verdicts (`Generator::take_verified`). A sequence that speculates never
//! takes the run-ahead policy: its tokens depend on the host's verdicts.

mod draft_model;
mod lookup;
mod state;
mod verify;

pub use draft_model::{DraftModel, DraftRequest};
pub use lookup::lookup_draft;
pub use state::{SequenceDraft, SpeculativeStats, StepTime};
pub use verify::{verify, DraftDistribution, Verdict};

use kestrel_model::ModelError;

/// Most tokens a draft may propose: a verification is at most this plus one rows.
pub const MAX_DRAFT: usize = 16;
/// Decoding sequences above which a step runs no drafts: their rows already share each read of
/// the weights, and verification rows would make the step compute-bound (docs/internals.md,
/// "Speculative decoding").
pub const MAX_SPECULATIVE_BATCH: usize = 4;

/// How an engine speculates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeculativeOptions {
    /// Draft by prompt lookup (alone, or first, with the draft model where lookup finds nothing).
    pub lookup: bool,
    /// Most tokens per draft (1 to `MAX_DRAFT`).
    pub draft_max: usize,
    /// A draft model stops drafting where its top token's probability falls under this
    /// (llama.cpp's `p_min`).
    pub p_min: f32,
}

impl Default for SpeculativeOptions {
    /// llama.cpp's defaults for `--draft-max` and `--draft-p-min`.
    fn default() -> Self {
        Self { lookup: false, draft_max: 16, p_min: 0.75 }
    }
}

impl SpeculativeOptions {
    pub fn validate(&self) -> Result<(), ModelError> {
        if !(1..=MAX_DRAFT).contains(&self.draft_max) {
            return Err(ModelError::InvalidOption {
                name: "draft_max",
                reason: format!("must be 1 to {MAX_DRAFT}, got {}", self.draft_max),
            });
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(ModelError::InvalidOption { name: "draft_p_min", reason: format!("must be 0 to 1, got {}", self.p_min) });
        }
        Ok(())
    }
}
