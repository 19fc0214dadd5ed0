//! A weight product in every variant a step runs, emitted in one call: the one-token matvec
//! (decode), the tiled matmul (a prompt chunk) and the matvec over each batch's tokens (a batched
//! decode step). The graph names a product once and `Graph::new` reads as the layer.

use kestrel_gpu::kernels::matmul::{MatmulDispatch, MatmulKernel, SwigluMatmulKernel};
use kestrel_gpu::kernels::matvec::{MatvecKernel, SwigluMatvecKernel};
use kestrel_gpu::kernels::{Epilogue, GateUpOperands, Operands, OutputColumns};
use kestrel_gpu::{Dispatch, Gpu, GpuError, StepUniform, Tensor, WeightTensor};
use kestrel_ops::params::GateActivation;

use super::plan::StepPlan;

/// What a product computes from its input rows.
#[derive(Clone, Copy)]
pub enum Product<'a> {
    /// `y = W x` (+ bias, + the old `y`, per the epilogue), into `out`'s columns of each row of y.
    Matrix { weight: &'a WeightTensor, bias: Option<&'a Tensor>, epilogue: Epilogue, out: OutputColumns },
    /// A gated FFN's fused gate and up projections: `y = act(Wg x) * (Wu x)`.
    GateUp { gate: &'a WeightTensor, up: &'a WeightTensor, act: GateActivation },
}

impl<'a> Product<'a> {
    /// `weight` alone, into whole rows of y.
    pub fn matrix(weight: &'a WeightTensor, epilogue: Epilogue) -> Self {
        Self::Matrix { weight, bias: None, epilogue, out: OutputColumns::whole(weight.rows as u32) }
    }
}

/// Emits products into a plan; holds what every matmul binds (the step uniform, the chunk size).
pub struct Products<'a> {
    pub gpu: &'a Gpu,
    pub step: &'a StepUniform,
    pub max_tokens: u32,
}

impl Products<'_> {
    /// Appends `product` of the rows of `x` into `y` under `family`: the one-token matvec to the
    /// decode list, the matmul to the prefill list, and to each batch list the matvec over its
    /// tokens.
    pub async fn emit(
        &self,
        plan: &mut StepPlan,
        family: &'static str,
        product: Product<'_>,
        x: &Tensor,
        y: &Tensor,
    ) -> Result<(), GpuError> {
        plan.split(family, self.matvec(product, 1, x, y).await?, self.matmul(product, x, y).await?);
        for batch in &mut plan.batches {
            batch.push(family, self.matvec(product, batch.columns as u32, x, y).await?);
        }
        Ok(())
    }

    /// The matvec of `product` over `columns` tokens, bound.
    async fn matvec(&self, product: Product<'_>, columns: u32, x: &Tensor, y: &Tensor) -> Result<Dispatch, GpuError> {
        let gpu = self.gpu;
        match product {
            Product::Matrix { weight, bias, epilogue, out } => {
                MatvecKernel::batched(gpu, weight.ty, epilogue, columns).await?.bind(gpu, &Operands { w: weight, x, y, out, bias })
            }
            Product::GateUp { gate, up, act } => {
                SwigluMatvecKernel::batched(gpu, gate.ty, act, columns).await?.bind(gpu, &GateUpOperands { gate, up, x, out: y })
            }
        }
    }

    /// The matmul of `product` over a chunk of up to `max_tokens` tokens, bound.
    async fn matmul(&self, product: Product<'_>, x: &Tensor, y: &Tensor) -> Result<MatmulDispatch, GpuError> {
        let (gpu, step, max_tokens) = (self.gpu, self.step, self.max_tokens);
        match product {
            Product::Matrix { weight, bias, epilogue, out } => {
                MatmulKernel::new(gpu, weight.ty, epilogue).await?.bind(gpu, &Operands { w: weight, x, y, out, bias }, step, max_tokens)
            }
            Product::GateUp { gate, up, act } => {
                SwigluMatmulKernel::new(gpu, gate.ty, act).await?.bind(gpu, &GateUpOperands { gate, up, x, out: y }, step, max_tokens)
            }
        }
    }
}
