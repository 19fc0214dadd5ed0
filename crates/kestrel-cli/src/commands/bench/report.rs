//! The results: one row per kernel case, printed as a Markdown table and written as JSON.

use std::path::Path;

use kestrel_gpu::kernels::matvec::{wide_unit_rows, WIDE_UNIT_TYPES};
use kestrel_gpu::GpuInfo;
use serde::Serialize;

use super::timing::Measurement;
use super::BenchResult;

const MIB: f64 = (1u64 << 20) as f64;

/// What identifies a case in the table.
#[derive(Clone, Debug, Serialize)]
pub struct CaseId {
    pub model: &'static str,
    pub kernel: &'static str,
    #[serde(rename = "type")]
    pub ty: String,
    pub shape: String,
}

/// One line of the table: timed, or skipped because a buffer exceeds the device's limits.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub id: CaseId,
    pub bytes_per_call: Option<u64>,
    pub us_per_call: Option<f64>,
    pub gb_per_s: Option<f64>,
    /// GB/s over the copy kernel's GB/s on the same adapter in the same run.
    pub fraction_of_copy: Option<f64>,
    /// Floating-point operations per second (a multiply-add counts two), for the matrix
    /// products and the FMA yardstick, in units of 10^9.
    pub gflop_per_s: Option<f64>,
    /// GFLOP/s over the FMA kernel's on the same adapter in the same run.
    pub fraction_of_fma: Option<f64>,
    pub calls_per_batch: Option<u32>,
    pub batches: Option<u32>,
    pub skipped: Option<String>,
}

impl Row {
    pub fn timed(id: CaseId, bytes: u64, time: &Measurement, copy_gb_per_s: f64) -> Self {
        let gb_per_s = gb_per_s(bytes, time);
        Self {
            id,
            bytes_per_call: Some(bytes),
            us_per_call: Some(time.seconds_per_call * 1e6),
            gb_per_s: Some(gb_per_s),
            fraction_of_copy: Some(gb_per_s / copy_gb_per_s),
            gflop_per_s: None,
            fraction_of_fma: None,
            calls_per_batch: Some(time.calls_per_batch),
            batches: Some(time.batches),
            skipped: None,
        }
    }

    /// A case with a buffer of `needed` bytes, over the device's binding `limit`.
    pub fn over_limit(id: CaseId, needed: u64, limit: u64) -> Self {
        let (needed, limit) = (needed as f64 / MIB, limit as f64 / MIB);
        Self::skipped(id, format!("skipped: needs {needed:.0} MiB, binding limit {limit:.0} MiB"))
    }

    /// A case predicted to take `predicted_s` per call, over `--max-call-ms`.
    pub fn too_slow(id: CaseId, predicted_s: f64, max_call_ms: u64) -> Self {
        let predicted = if predicted_s >= 1.0 { format!("{predicted_s:.1} s") } else { format!("{:.0} ms", predicted_s * 1e3) };
        Self::skipped(id, format!("skipped: ~{predicted} per call predicted, over --max-call-ms {max_call_ms}"))
    }

    fn skipped(id: CaseId, reason: String) -> Self {
        Self {
            id,
            bytes_per_call: None,
            us_per_call: None,
            gb_per_s: None,
            fraction_of_copy: None,
            gflop_per_s: None,
            fraction_of_fma: None,
            calls_per_batch: None,
            batches: None,
            skipped: Some(reason),
        }
    }

    /// The arithmetic rate of a call of `flops` operations timed as `time`, and its fraction of
    /// the FMA kernel's `fma_gflop_per_s` (the yardstick's own row: 1).
    pub fn with_flops(mut self, flops: u64, time: &Measurement, fma_gflop_per_s: f64) -> Self {
        let gflop_per_s = flops as f64 / time.seconds_per_call / 1e9;
        self.gflop_per_s = Some(gflop_per_s);
        self.fraction_of_fma = Some(gflop_per_s / fma_gflop_per_s);
        self
    }

    /// The row as a Markdown table line.
    pub fn markdown(&self) -> String {
        let CaseId { model, kernel, ty, shape } = &self.id;
        let cells = match (self.us_per_call, self.gb_per_s, self.fraction_of_copy, &self.skipped) {
            (Some(us), Some(gbs), Some(fraction), _) => {
                let flops = match (self.gflop_per_s, self.fraction_of_fma) {
                    (Some(g), Some(f)) => format!("{g:>8.2} | {:>7.1}%", 100.0 * f),
                    _ => " | ".to_string(),
                };
                format!("{us:>10.1} | {gbs:>7.2} | {:>8.1}% | {flops}", 100.0 * fraction)
            }
            (_, _, _, reason) => format!("{} | | | | ", reason.as_deref().unwrap_or("-")),
        };
        format!("| {model} | {kernel} | {ty} | {shape} | {cells} |")
    }
}

/// Effective bandwidth: the bytes a call must move over its time, in GB/s (10^9 bytes).
pub fn gb_per_s(bytes: u64, time: &Measurement) -> f64 {
    bytes as f64 / time.seconds_per_call / 1e9
}

pub const TABLE_HEADER: &str =
    "| model | kernel | type | shape | µs/call | GB/s | % of copy | GFLOP/s | % of FMA |\n|---|---|---|---|--:|--:|--:|--:|--:|";

/// The adapter the run measured, as the report's header states it.
#[derive(Debug, Serialize)]
pub struct Adapter {
    pub name: String,
    pub backend: String,
    pub driver: String,
    pub features: Vec<&'static str>,
    pub max_storage_buffer_binding_size: u64,
    /// A software (CPU-emulated) adapter.
    pub software: bool,
    /// The decode matvec's variant on this adapter: threads per row, rows per thread.
    pub matvec_slices: u32,
    pub matvec_rows_per_thread: u32,
}

impl Adapter {
    pub fn new(info: &GpuInfo) -> Self {
        let f = info.features;
        let features = [("shader-f16", f.shader_f16), ("subgroups", f.subgroups), ("timestamps", f.timestamps)]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
        Self {
            name: info.adapter_name.clone(),
            backend: info.backend.clone(),
            driver: info.driver.clone(),
            features,
            max_storage_buffer_binding_size: info.max_storage_buffer_binding_size,
            software: info.software,
            matvec_slices: info.kernels.matvec.slices,
            matvec_rows_per_thread: info.kernels.matvec.rows_per_thread,
        }
    }

    /// Markdown lines above the table.
    pub fn markdown(&self, timing: &str) -> String {
        let features = if self.features.is_empty() { "none".to_string() } else { self.features.join(", ") };
        format!(
            "adapter: {} ({}, {}{})  \nfeatures: {features}; binding limit {:.0} MiB  \nkernels: matvec with {} thread(s) per row, {} rows per thread ({})  \ntiming: {timing}",
            self.name,
            self.backend,
            self.driver,
            if self.software { ", software" } else { "" },
            self.max_storage_buffer_binding_size as f64 / MIB,
            self.matvec_slices,
            self.matvec_rows_per_thread,
            wide_unit_note(self.matvec_rows_per_thread),
        )
    }
}

/// Which types the matvec runs with fewer rows per thread than the adapter's variant.
fn wide_unit_note(rows_per_thread: u32) -> String {
    let wide = wide_unit_rows(rows_per_thread);
    if wide == rows_per_thread {
        return "every type".into();
    }
    let types: Vec<String> = WIDE_UNIT_TYPES.iter().map(|t| t.to_string()).collect();
    format!("{wide} for {}", types.join(", "))
}

/// Everything a run measured, as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct Report {
    pub adapter: Adapter,
    pub timing: &'static str,
    pub copy_gb_per_s: f64,
    pub fma_gflop_per_s: f64,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn write_json(&self, path: &Path) -> BenchResult<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(())
    }
}
