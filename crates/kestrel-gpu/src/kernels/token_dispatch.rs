//! The dispatch of a kernel whose work grows with the step's token count (norms, RoPE, the
//! encoder's elementwise kernels): bound once, its grid chosen at record time from the same
//! `n_tokens` the shader reads, so a prefill chunk of any length runs only the workgroups it needs.

use crate::{grid, Dispatch, Recorder, StepOp, StepParams};

/// A kernel bound to its buffers; runs `per_token` items of work for each of the step's tokens,
/// `per_workgroup` items in a workgroup (a token's last workgroup may run into the next token's
/// items: the shaders index by the global item number and check it against the step's count).
pub struct TokenDispatch {
    dispatch: Dispatch,
    per_token: u32,
    per_workgroup: u32,
    max_per_dim: u32,
}

impl TokenDispatch {
    pub(crate) fn new(dispatch: Dispatch, per_token: u32, per_workgroup: u32, max_per_dim: u32) -> Self {
        Self { dispatch, per_token, per_workgroup, max_per_dim }
    }

    /// The grid for `n_tokens` tokens.
    pub fn workgroups(&self, n_tokens: u32) -> [u32; 3] {
        grid((n_tokens * self.per_token).div_ceil(self.per_workgroup), self.max_per_dim)
    }
}

impl StepOp for TokenDispatch {
    /// The work of the step's `n_tokens` tokens.
    fn record(&self, rec: &mut Recorder, step: &StepParams) {
        self.dispatch.record_with(rec, self.workgroups(step.n_tokens));
    }
}
