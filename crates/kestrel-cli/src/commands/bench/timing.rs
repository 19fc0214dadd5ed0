//! Timing one kernel call: GPU timestamps around a compute pass of N identical calls when the
//! device has them, else the wall-clock time of one submit of N calls. Either way the batch size
//! adapts to a per-kernel time budget and the median over a few batches is reported.

use std::time::{Duration, Instant};

use kestrel_gpu::{wgpu, Gpu, Readback, Recorder};

use super::stats::median;
use super::BenchResult;

/// Calls per batch never exceed this (recording costs CPU time and memory per call).
const MAX_CALLS_PER_BATCH: u32 = 10_000;
/// Two u64 timestamps: start and end of the timed pass.
const TIMESTAMP_BYTES: u64 = 2 * wgpu::QUERY_SIZE as u64;

/// How long to spend per kernel and how to split it.
#[derive(Clone, Copy, Debug)]
pub struct TimingSettings {
    /// Time budget of the timed batches of one kernel (the warm-up call comes on top).
    pub target: Duration,
    /// Timed batches per kernel; the median is reported. Fewer when they exceed the budget.
    pub reps: u32,
    /// Calls per batch; `None` adapts them to `target`.
    pub calls: Option<u32>,
}

/// The median time of one call and how it was measured.
#[derive(Clone, Copy, Debug)]
pub struct Measurement {
    pub seconds_per_call: f64,
    /// Calls in the last batch (batches are re-sized as the time per call becomes known).
    pub calls_per_batch: u32,
    pub batches: u32,
}

/// Where the time of a batch comes from.
enum Clock {
    /// GPU timestamps at the boundaries of the batch's compute pass.
    Timestamps { query_set: wgpu::QuerySet, resolve: wgpu::Buffer, readback: Readback, ns_per_tick: f64 },
    /// Host time from submit to completion: includes submission and wake-up latency, which a
    /// large enough batch amortizes.
    Wall,
}

pub struct Timer {
    gpu: Gpu,
    clock: Clock,
    settings: TimingSettings,
}

impl Timer {
    /// Uses timestamps if the device has them and `wall_clock` is not forced.
    pub fn new(gpu: &Gpu, settings: TimingSettings, wall_clock: bool) -> Self {
        let clock = if gpu.features.timestamps && !wall_clock { timestamp_clock(gpu) } else { Clock::Wall };
        Self { gpu: gpu.clone(), clock, settings }
    }

    /// How batches are timed, for the report.
    pub fn method(&self) -> &'static str {
        match self.clock {
            Clock::Timestamps { .. } => "GPU timestamps",
            Clock::Wall => "wall clock",
        }
    }

    /// Times `record`, which records one call of a kernel, within the time budget: the median
    /// per-call time of up to `reps` batches (at least one).
    pub fn measure(&self, record: &dyn Fn(&mut Recorder)) -> BenchResult<Measurement> {
        self.measure_batches(record, false)
    }

    /// Like [`Timer::measure`], but always `reps` batches: for the copy kernel, the yardstick of
    /// every other row.
    pub fn measure_all_reps(&self, record: &dyn Fn(&mut Recorder)) -> BenchResult<Measurement> {
        self.measure_batches(record, true)
    }

    /// A warm-up call, then batches sized from the latest per-call time so that `reps` of them
    /// fill the budget. Re-sizing after every batch corrects a warm-up that first-use costs made
    /// slow; a kernel slower than the whole budget gets one single-call batch unless `all_reps`.
    fn measure_batches(&self, record: &dyn Fn(&mut Recorder), all_reps: bool) -> BenchResult<Measurement> {
        let TimingSettings { target, reps, calls } = self.settings;
        let (target, reps) = (target.as_secs_f64(), reps.max(1));
        self.finish_uploads()?;
        let mut per_call = self.batch(record, 1)?.max(1e-9);
        let (mut samples, mut spent, mut calls_per_batch) = (Vec::new(), 0.0, 1);
        while samples.len() < reps as usize && (all_reps || samples.is_empty() || spent < target) {
            let fill = (target / f64::from(reps) / per_call).clamp(1.0, f64::from(MAX_CALLS_PER_BATCH));
            calls_per_batch = calls.unwrap_or(fill as u32);
            let seconds = self.batch(record, calls_per_batch)?;
            spent += seconds;
            per_call = (seconds / f64::from(calls_per_batch)).max(1e-9);
            samples.push(per_call);
        }
        let batches = samples.len() as u32;
        Ok(Measurement { seconds_per_call: median(&mut samples), calls_per_batch, batches })
    }

    /// Waits for queued buffer writes (a case's weights and inputs) so that no batch pays for them.
    fn finish_uploads(&self) -> BenchResult<()> {
        self.wait(self.gpu.queue.submit([]))
    }

    fn wait(&self, submission: wgpu::SubmissionIndex) -> BenchResult<()> {
        self.gpu
            .device
            .poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: None })
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        Ok(())
    }

    /// Seconds taken by `calls` back-to-back calls recorded into one submit.
    fn batch(&self, record: &dyn Fn(&mut Recorder), calls: u32) -> BenchResult<f64> {
        match &self.clock {
            Clock::Wall => {
                let mut rec = Recorder::new(&self.gpu);
                (0..calls).for_each(|_| record(&mut rec));
                let start = Instant::now();
                self.wait(rec.submit())?;
                Ok(start.elapsed().as_secs_f64())
            }
            Clock::Timestamps { query_set, resolve, readback, ns_per_tick } => {
                let mut rec = Recorder::new_timed(&self.gpu, query_set);
                (0..calls).for_each(|_| record(&mut rec));
                if rec.dispatches() == 0 {
                    return Err("the kernel recorded no dispatch to time".into());
                }
                rec.resolve_queries(query_set, 0..2, resolve, 0);
                rec.copy(resolve, 0, readback.buffer(), 0, TIMESTAMP_BYTES);
                rec.submit();
                let words = pollster::block_on(readback.read_u32(&self.gpu, TIMESTAMP_BYTES))?;
                let tick = |i: usize| u64::from(words[2 * i]) | (u64::from(words[2 * i + 1]) << 32);
                let (start, end) = (tick(0), tick(1));
                if end <= start {
                    return Err(format!("timestamps did not advance ({start} -> {end}); try --wall-clock").into());
                }
                Ok((end - start) as f64 * ns_per_tick * 1e-9)
            }
        }
    }
}

fn timestamp_clock(gpu: &Gpu) -> Clock {
    let query_set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("bench.timestamps"),
        ty: wgpu::QueryType::Timestamp,
        count: 2,
    });
    let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench.timestamps.resolve"),
        size: TIMESTAMP_BYTES,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let readback = Readback::new(gpu, TIMESTAMP_BYTES);
    let ns_per_tick = f64::from(gpu.queue.get_timestamp_period());
    Clock::Timestamps { query_set, resolve, readback, ns_per_tick }
}
