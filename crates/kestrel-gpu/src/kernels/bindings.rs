//! How every kernel binds its resources: a [`Bindings`] list, written in the order of its
//! shader's `@group(0) @binding(i)` declarations, finished into the [`Dispatch`] that records it.
//! A kernel's Rust side then says only what it binds and how large its grid is; the bind group,
//! its uniform and the device's grid limit are handled here once.

use std::sync::Arc;

use super::TokenDispatch;
use crate::{grid, Dispatch, Gpu, StepUniform, Tensor};

/// The buffers of one dispatch, binding 0 first.
pub(crate) struct Bindings<'a> {
    gpu: &'a Gpu,
    /// The kernel's name: the label of its bind group and of the uniform made here.
    kernel: &'a str,
    buffers: Vec<wgpu::Buffer>,
}

impl<'a> Bindings<'a> {
    pub(crate) fn new(gpu: &'a Gpu, kernel: &'a str) -> Self {
        Self { gpu, kernel, buffers: Vec::new() }
    }

    /// The next binding: a buffer made elsewhere (scratch, or a uniform written again later).
    pub(crate) fn buffer(mut self, buffer: &wgpu::Buffer) -> Self {
        self.buffers.push(buffer.clone());
        self
    }

    pub(crate) fn tensor(self, tensor: &Tensor) -> Self {
        self.buffer(&tensor.buffer)
    }

    /// The next binding when `tensor` is given (a bias the kernel was built to add); none when not.
    pub(crate) fn optional(self, tensor: Option<&Tensor>) -> Self {
        match tensor {
            Some(t) => self.tensor(t),
            None => self,
        }
    }

    pub(crate) fn step(self, step: &StepUniform) -> Self {
        self.buffer(&step.buffer)
    }

    /// The next binding: a new uniform buffer holding `params`, fixed from now on.
    pub(crate) fn uniform(self, params: &impl bytemuck::Pod) -> Self {
        let uniform = self.gpu.uniform_buffer(&format!("{}.params", self.kernel), bytemuck::bytes_of(params));
        self.buffer(&uniform)
    }

    /// The dispatch of `pipeline` over these bindings with a fixed grid.
    pub(crate) fn dispatch(self, pipeline: &Arc<wgpu::ComputePipeline>, workgroups: [u32; 3]) -> Dispatch {
        let resources: Vec<wgpu::BindingResource<'_>> = self.buffers.iter().map(|b| b.as_entire_binding()).collect();
        Dispatch::new(self.gpu, self.kernel, pipeline.clone(), &resources, workgroups)
    }

    /// The dispatch of `n` workgroups, spread over x and y within the device's limit (`grid`).
    pub(crate) fn dispatch_grid(self, pipeline: &Arc<wgpu::ComputePipeline>, n: u32) -> Dispatch {
        let workgroups = grid(n, self.gpu.limits.max_compute_workgroups_per_dimension);
        self.dispatch(pipeline, workgroups)
    }

    /// The dispatch whose grid the step's token count sizes when recorded: `per_token` items of
    /// work for each token, `per_workgroup` of them in a workgroup.
    pub(crate) fn dispatch_per_token(self, pipeline: &Arc<wgpu::ComputePipeline>, per_token: u32, per_workgroup: u32) -> TokenDispatch {
        let max_per_dim = self.gpu.limits.max_compute_workgroups_per_dimension;
        TokenDispatch::new(self.dispatch(pipeline, [1, 1, 1]), per_token, per_workgroup, max_per_dim)
    }
}
