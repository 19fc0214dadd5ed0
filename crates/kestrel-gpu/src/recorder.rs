//! Batches many dispatches into one command encoder and one compute pass, submitted once. A
//! decode step is a single `Recorder` from embedding to sampled token.

use std::ops::Range;
use std::sync::Arc;

use crate::{Gpu, StepOp, StepParams};

/// One prepared kernel invocation: a pipeline, a bind group built once (buffers never move),
/// and its default grid. Recording it again costs no allocation.
pub struct Dispatch {
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
}

impl Dispatch {
    /// Builds the bind group for `pipeline` from `resources`, bound at group 0 in order
    /// (binding 0, 1, 2, ...).
    pub fn new(
        gpu: &Gpu,
        label: &str,
        pipeline: Arc<wgpu::ComputePipeline>,
        resources: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) -> Self {
        let entries: Vec<wgpu::BindGroupEntry<'_>> =
            resources.iter().enumerate().map(|(i, r)| wgpu::BindGroupEntry { binding: i as u32, resource: r.clone() }).collect();
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Self { pipeline, bind_group, workgroups }
    }

    pub fn record(&self, rec: &mut Recorder) {
        rec.dispatch(self, self.workgroups);
    }

    /// Records with a grid decided at record time (prefill chunks of varying length).
    pub fn record_with(&self, rec: &mut Recorder, workgroups: [u32; 3]) {
        rec.dispatch(self, workgroups);
    }
}

impl StepOp for Dispatch {
    /// The fixed grid: a kernel whose work does not depend on the step (a decode matvec).
    fn record(&self, rec: &mut Recorder, _step: &StepParams) {
        rec.dispatch(self, self.workgroups);
    }
}

/// Spreads `n` workgroups over x and y so that neither exceeds the per-dimension limit
/// (65535 on most adapters). Shaders recover the linear index as `wg.x + wg.y * nwg.x`.
pub fn grid(n: u32, max_per_dim: u32) -> [u32; 3] {
    if n <= max_per_dim {
        [n.max(1), 1, 1]
    } else {
        let y = n.div_ceil(max_per_dim);
        [n.div_ceil(y), y, 1]
    }
}

pub struct Recorder {
    gpu: Gpu,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    dispatches: u32,
    /// Set by [`Recorder::new_timed`]: taken by the first compute pass begun, which writes its
    /// start and end timestamps into slots 0 and 1.
    timestamps: Option<wgpu::QuerySet>,
}

impl Recorder {
    pub fn new(gpu: &Gpu) -> Self {
        Self { gpu: gpu.clone(), encoder: None, pass: None, dispatches: 0, timestamps: None }
    }

    /// A recorder whose compute pass writes GPU timestamps at its start and end into slots 0 and
    /// 1 of `query_set` (a timestamp set of at least 2 queries; needs `GpuFeatures::timestamps`).
    /// Only the first pass is timed and [`Recorder::copy`] ends a pass, so time recordings made
    /// of dispatches only. Benchmarks divide the pass's span by the dispatches in it.
    pub fn new_timed(gpu: &Gpu, query_set: &wgpu::QuerySet) -> Self {
        Self { timestamps: Some(query_set.clone()), ..Self::new(gpu) }
    }

    /// Ends the current pass (its end timestamp is written then) and resolves `queries` of
    /// `query_set` into `destination` at `offset`, a buffer with `QUERY_RESOLVE` usage.
    pub fn resolve_queries(&mut self, query_set: &wgpu::QuerySet, queries: Range<u32>, destination: &wgpu::Buffer, offset: u64) {
        self.pass = None;
        self.encoder().resolve_query_set(query_set, queries, destination, offset);
    }

    pub fn dispatch(&mut self, d: &Dispatch, workgroups: [u32; 3]) {
        if workgroups.contains(&0) {
            return;
        }
        let pass = self.pass();
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        self.dispatches += 1;
    }

    /// Copies between buffers, in order with the dispatches around it.
    pub fn copy(&mut self, src: &wgpu::Buffer, src_offset: u64, dst: &wgpu::Buffer, dst_offset: u64, size: u64) {
        self.pass = None;
        self.encoder().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
    }

    /// Number of kernel dispatches recorded so far.
    pub fn dispatches(&self) -> u32 {
        self.dispatches
    }

    /// Ends recording and submits everything in one queue submission.
    pub fn submit(mut self) -> wgpu::SubmissionIndex {
        self.pass = None;
        let encoder = self.encoder.take().unwrap_or_else(|| new_encoder(&self.gpu));
        self.gpu.queue.submit([encoder.finish()])
    }

    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        let gpu = &self.gpu;
        self.encoder.get_or_insert_with(|| new_encoder(gpu))
    }

    fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        let Self { gpu, encoder, pass, timestamps, .. } = self;
        pass.get_or_insert_with(|| {
            let timestamps = timestamps.take();
            let timestamp_writes = timestamps.as_ref().map(|query_set| wgpu::ComputePassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            });
            encoder
                .get_or_insert_with(|| new_encoder(gpu))
                .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("kestrel"), timestamp_writes })
                .forget_lifetime()
        })
    }
}

fn new_encoder(gpu: &Gpu) -> wgpu::CommandEncoder {
    gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kestrel") })
}

#[cfg(test)]
mod tests {
    use super::grid;

    #[test]
    fn grid_splits_large_counts() {
        assert_eq!(grid(10, 65535), [10, 1, 1]);
        assert_eq!(grid(0, 65535), [1, 1, 1]);
        let [x, y, _] = grid(128_256, 65535);
        assert!(x <= 65535 && y <= 65535 && x * y >= 128_256);
    }
}
