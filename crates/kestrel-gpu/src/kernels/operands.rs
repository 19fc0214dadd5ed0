//! What a matrix product (matvec for decode, matmul for prefill) reads and writes, given to its
//! kernel's `bind` as one value, and the checks both kernels make of it.

use kestrel_gguf::GgmlType;

use super::weights::{check_bias, check_distinct, check_same_layout, check_tensor, check_weight_type, Epilogue, WeightParams};
use crate::{DType, GpuError, Tensor, WeightTensor};

/// Where a matrix product writes its N outputs of each token: columns `offset .. offset + N` of
/// rows of `stride` values. Several products can then fill one activation row side by side,
/// e.g. Q, K and V of different weight types into the `[q | k | v]` row RoPE reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputColumns {
    pub offset: u32,
    pub stride: u32,
}

impl OutputColumns {
    /// The whole row: N outputs per token, packed.
    pub fn whole(n: u32) -> Self {
        Self { offset: 0, stride: n }
    }

    /// Values of `y` the product needs for `tokens` tokens of `n` outputs, or an error.
    pub(crate) fn needed_len(self, kernel: &str, n: u32, tokens: u32) -> Result<u64, GpuError> {
        let end = u64::from(self.offset) + u64::from(n);
        if end > u64::from(self.stride) {
            return Err(GpuError::InvalidArgs(format!(
                "{kernel}: output columns {}..{end} do not fit in rows of {}",
                self.offset, self.stride
            )));
        }
        Ok(u64::from(tokens.saturating_sub(1)) * u64::from(self.stride) + end)
    }
}

/// `y = x·Wᵀ` (+ `bias`): x f32 rows of the weights' K values, each token's N outputs at `out` of
/// its row of y (f32), bias f32 (N values, only for a kernel built with `Epilogue::bias`).
pub struct Operands<'a> {
    pub w: &'a WeightTensor,
    pub x: &'a Tensor,
    pub y: &'a Tensor,
    pub out: OutputColumns,
    pub bias: Option<&'a Tensor>,
}

impl<'a> Operands<'a> {
    /// The product filling the whole of each of y's rows (`OutputColumns::whole`).
    pub fn whole(w: &'a WeightTensor, x: &'a Tensor, y: &'a Tensor, bias: Option<&'a Tensor>) -> Self {
        Self { w, x, y, out: OutputColumns::whole(w.rows as u32), bias }
    }

    /// Checks the operands of a `kernel` built for `ty` weights with `epilogue`, for `tokens`
    /// tokens: x holds that many rows of K and y that many of `out`, in distinct buffers, every
    /// index fits in u32, and a bias is given exactly when the epilogue adds one. Returns the
    /// weights' uniform.
    pub(crate) fn check(&self, kernel: &str, ty: GgmlType, epilogue: Epilogue, tokens: u32) -> Result<WeightParams, GpuError> {
        check_weight_type(kernel, ty, self.w)?;
        if tokens == 0 {
            return Err(GpuError::InvalidArgs(format!("{kernel}: max_tokens must be at least 1")));
        }
        let params = WeightParams::new(kernel, self.w, tokens)?.with_output(self.out);
        let x_len = u64::from(tokens) * u64::from(params.cols());
        let y_len = self.out.needed_len(kernel, params.rows(), tokens)?;
        if x_len.max(y_len) > u64::from(u32::MAX) {
            return Err(GpuError::InvalidArgs(format!("{kernel}: {tokens} tokens are too many for 32-bit indexing")));
        }
        check_tensor(kernel, "x", self.x, DType::F32, x_len)?;
        check_tensor(kernel, "y", self.y, DType::F32, y_len)?;
        check_distinct(kernel, &[("x", &self.x.buffer), ("y", &self.y.buffer)])?;
        check_bias(kernel, epilogue, self.bias, params.rows(), self.y)?;
        Ok(params)
    }
}

/// The fused gate/up projection of a gated FFN: `out = act(x·Wgᵀ) * (x·Wuᵀ)`, `Wg` and `Wu` of
/// the same type and shape (N x K), x f32 rows of K values, out f32 rows of N.
pub struct GateUpOperands<'a> {
    pub gate: &'a WeightTensor,
    pub up: &'a WeightTensor,
    pub x: &'a Tensor,
    pub out: &'a Tensor,
}

impl GateUpOperands<'_> {
    /// [`Operands::check`] of the gate's product (whole rows, no bias), and that `up` matches it.
    pub(crate) fn check(&self, kernel: &str, ty: GgmlType, tokens: u32) -> Result<WeightParams, GpuError> {
        check_same_layout(kernel, self.gate, self.up)?;
        Operands::whole(self.gate, self.x, self.out, None).check(kernel, ty, Epilogue::NONE, tokens)
    }
}
