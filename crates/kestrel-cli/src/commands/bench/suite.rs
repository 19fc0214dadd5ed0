//! The list of cases at one model's shapes, run one after another: each is built only if the
//! filter selects it, timed, and dropped before the next (so memory holds one case at a time).

use std::collections::HashMap;

use kestrel_gguf::GgmlType;
use kestrel_gpu::{Gpu, GpuError};
use kestrel_model::synthetic::SyntheticShape;
use kestrel_ops::params::{KvType, SamplingParams};

use super::cases::{self, Prepared};
use super::report::{gb_per_s, CaseId, Row};
use super::shapes::{matrices, whole_blocks, Matrix, Product, DECODE_BATCH, DECODE_KV_LENS, PREFILL_TOKENS, WEIGHT_TYPES};
use super::timing::Timer;
use super::BenchResult;

/// The order of the kernels in the table (rows of one kernel keep the order they ran in).
const KERNELS: [&str; 11] =
    ["copy", "fma", "matvec", "matmul", "embedding", "rmsnorm", "rope", "attn decode", "attn prefill", "argmax", "sample"];

pub struct Suite<'a> {
    gpu: &'a Gpu,
    timer: &'a Timer,
    /// Lowercase words that must all occur in a case's "model kernel type shape".
    filter: Vec<String>,
    /// Matrix products predicted to take longer per call are skipped (slow devices).
    max_call_ms: Option<u64>,
    /// Seconds per multiply-add of the last timed matrix product of each kernel and weight type.
    seconds_per_mac: HashMap<(&'static str, String), f64>,
    copy_gb_per_s: f64,
    fma_gflop_per_s: f64,
    rows: Vec<Row>,
}

/// The two matrix-product kernels.
#[derive(Clone, Copy)]
enum Kernel {
    Matvec,
    Matmul,
}

/// Threads of the FMA yardstick: enough to fill the largest GPUs (an H200's 132 SMs hold 2048
/// threads each).
const FMA_THREADS: usize = 1 << 19;

impl<'a> Suite<'a> {
    /// `max_call_ms`: skip matrix products predicted to be slower per call (`None`: no cap).
    pub fn new(gpu: &'a Gpu, timer: &'a Timer, filter: Option<&str>, max_call_ms: Option<u64>) -> Self {
        let filter = filter.unwrap_or_default().split_whitespace().map(str::to_lowercase).collect();
        Self {
            gpu,
            timer,
            filter,
            max_call_ms,
            seconds_per_mac: HashMap::new(),
            copy_gb_per_s: 0.0,
            fma_gflop_per_s: 0.0,
            rows: Vec::new(),
        }
    }

    /// Times the copy kernel over `bytes` (the yardstick of every other row, so the filter
    /// does not apply) and returns its GB/s.
    pub fn copy(&mut self, bytes: u64) -> BenchResult<f64> {
        let id = case_id("-", "copy", "-", format!("{} MiB", bytes >> 20));
        let prepared = cases::copy(self.gpu, bytes)?;
        let time = self.timer.measure_all_reps(&*prepared.record)?;
        self.copy_gb_per_s = gb_per_s(prepared.bytes, &time);
        self.push(Row::timed(id, prepared.bytes, &time, self.copy_gb_per_s));
        Ok(self.copy_gb_per_s)
    }

    /// Times the FMA kernel (the arithmetic yardstick of the matrix products, so the filter does
    /// not apply) and returns its GFLOP/s.
    pub fn fma(&mut self) -> BenchResult<f64> {
        let id = case_id("-", "fma", "f32", format!("{FMA_THREADS} threads"));
        let (prepared, flops) = cases::fma(self.gpu, FMA_THREADS)?;
        let time = self.timer.measure_all_reps(&*prepared.record)?;
        self.fma_gflop_per_s = flops as f64 / time.seconds_per_call / 1e9;
        self.push(Row::timed(id, prepared.bytes, &time, self.copy_gb_per_s).with_flops(flops, &time, self.fma_gflop_per_s));
        Ok(self.fma_gflop_per_s)
    }

    /// Every kernel at `model`'s shapes.
    pub fn model(&mut self, model: &SyntheticShape) -> BenchResult<()> {
        let first_row = self.rows.len();
        for ty in WEIGHT_TYPES {
            for matrix in matrices(model).iter().filter(|m| whole_blocks(ty, m.cols)) {
                self.matrix(model, matrix, ty)?;
            }
            if whole_blocks(ty, model.hidden) {
                self.embedding(model, ty)?;
            }
        }
        self.small_kernels(model)?;
        self.attention(model)?;
        self.sampling(model)?;
        self.rows[first_row..].sort_by_key(|row| KERNELS.iter().position(|&k| k == row.id.kernel));
        Ok(())
    }

    /// The rows so far, in table order.
    pub fn into_rows(self) -> Vec<Row> {
        self.rows
    }

    /// The matrix's products with one set of weights, quantized once (and not at all when none
    /// runs): decode (matvec), a batched decode step of `DECODE_BATCH` sequences (the batched
    /// matvec, and the tiled matmul over as many tokens that it is measured against), prefill
    /// (matmul).
    fn matrix(&mut self, model: &SyntheticShape, matrix: &Matrix, ty: GgmlType) -> BenchResult<()> {
        let gpu = self.gpu;
        let count = if matrix.product == Product::Swiglu { "2x" } else { "" };
        let shape = format!("{} {count}{}x{}", matrix.name, matrix.rows, matrix.cols);
        let id = |kernel, shape: String| case_id(model.name, kernel, ty.name(), shape);
        let products = [
            (id("matvec", shape.clone()), Kernel::Matvec, 1),
            (id("matvec", format!("{shape}, B={DECODE_BATCH}")), Kernel::Matvec, DECODE_BATCH),
            (id("matmul", format!("{shape}, M={DECODE_BATCH}")), Kernel::Matmul, DECODE_BATCH),
            (id("matmul", format!("{shape}, M={PREFILL_TOKENS}")), Kernel::Matmul, PREFILL_TOKENS),
        ];
        let wanted: Vec<_> = products.into_iter().filter(|(id, ..)| self.wants(id)).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        if let Err(GpuError::Limit { needed, limit, .. }) = cases::check_fits(gpu, matrix, ty) {
            for (id, ..) in wanted {
                self.push(Row::over_limit(id, needed, limit));
            }
            return Ok(());
        }
        let runs: Vec<_> = wanted.into_iter().filter(|(id, _, tokens)| self.fast_enough(id, matrix.macs(*tokens))).collect();
        if runs.is_empty() {
            return Ok(());
        }
        let weights = cases::weights(gpu, matrix, ty)?;
        for (id, kernel, tokens) in runs {
            self.product_case(id, matrix.macs(tokens), || match kernel {
                Kernel::Matvec => cases::matvec(gpu, matrix, &weights, tokens),
                Kernel::Matmul => cases::matmul(gpu, matrix, &weights, tokens),
            })?;
        }
        Ok(())
    }

    /// Whether a matrix product of `macs` multiply-adds is predicted to stay under the cap,
    /// scaling the last one timed with the same kernel and weight type (the first always runs);
    /// pushes a "skipped" row if not.
    fn fast_enough(&mut self, id: &CaseId, macs: u64) -> bool {
        let rate = self.seconds_per_mac.get(&(id.kernel, id.ty.clone()));
        let (Some(max_call_ms), Some(rate)) = (self.max_call_ms, rate) else {
            return true;
        };
        let predicted_s = rate * macs as f64;
        if predicted_s * 1e3 <= max_call_ms as f64 {
            return true;
        }
        self.push(Row::too_slow(id.clone(), predicted_s, max_call_ms));
        false
    }

    /// A matrix product's case, with its arithmetic rate; its time per multiply-add predicts the
    /// next ones'.
    fn product_case(&mut self, id: CaseId, macs: u64, build: impl FnOnce() -> Result<Prepared, GpuError>) -> BenchResult<()> {
        let key = (id.kernel, id.ty.clone());
        if let Some(seconds) = self.case_with_flops(id, Some(2 * macs), build)? {
            self.seconds_per_mac.insert(key, seconds / macs as f64);
        }
        Ok(())
    }

    fn embedding(&mut self, model: &SyntheticShape, ty: GgmlType) -> BenchResult<()> {
        let gpu = self.gpu;
        for tokens in [1, PREFILL_TOKENS] {
            let shape = format!("{}x{}, {tokens} tok", model.vocab, model.hidden);
            self.case(case_id(model.name, "embedding", ty.name(), shape), || cases::embedding(gpu, model, ty, tokens))?;
        }
        Ok(())
    }

    /// RMSNorm and RoPE for one decode token and a prefill chunk.
    fn small_kernels(&mut self, model: &SyntheticShape) -> BenchResult<()> {
        let gpu = self.gpu;
        for tokens in [1, PREFILL_TOKENS] {
            let shape = format!("{tokens}x{}", model.hidden);
            self.case(case_id(model.name, "rmsnorm", "f32", shape), || cases::rmsnorm(gpu, model, tokens))?;
        }
        for tokens in [1, PREFILL_TOKENS] {
            let shape = format!("{tokens}x{}, {}/{} heads x {}", model.qkv_width(), model.n_heads, model.n_kv_heads, model.head_dim());
            self.case(case_id(model.name, "rope", KvType::default().name(), shape), || cases::rope(gpu, model, tokens))?;
        }
        Ok(())
    }

    fn attention(&mut self, model: &SyntheticShape) -> BenchResult<()> {
        let gpu = self.gpu;
        let heads = format!("{}/{} heads x {}", model.n_heads, model.n_kv_heads, model.head_dim());
        for kv_len in DECODE_KV_LENS {
            let id = case_id(model.name, "attn decode", KvType::default().name(), format!("kv {kv_len}, {heads}"));
            self.case(id, || cases::attention_decode(gpu, model, kv_len))?;
        }
        let id = case_id(model.name, "attn prefill", KvType::default().name(), format!("q {PREFILL_TOKENS} at pos 0, {heads}"));
        self.case(id, || cases::attention_prefill(gpu, model, PREFILL_TOKENS))?;
        Ok(())
    }

    fn sampling(&mut self, model: &SyntheticShape) -> BenchResult<()> {
        let gpu = self.gpu;
        let greedy = SamplingParams::greedy();
        let id = case_id(model.name, "argmax", "f32", format!("vocab {}", model.vocab));
        self.case(id, || cases::sample(gpu, model, &greedy))?;
        let p = SamplingParams::default();
        let shape = format!("vocab {}, top-k {} top-p {} min-p {} temp {}", model.vocab, p.top_k, p.top_p, p.min_p, p.temperature);
        self.case(case_id(model.name, "sample", "f32", shape), || cases::sample(gpu, model, &p))?;
        Ok(())
    }

    /// Builds, times and records one case if the filter selects it, returning its seconds per
    /// call; a buffer over the device's limits makes a "skipped" row, any other error ends the run.
    fn case(&mut self, id: CaseId, build: impl FnOnce() -> Result<Prepared, GpuError>) -> BenchResult<Option<f64>> {
        self.case_with_flops(id, None, build)
    }

    /// `case`, with the arithmetic rate of `flops` operations per call where given.
    fn case_with_flops(
        &mut self,
        id: CaseId,
        flops: Option<u64>,
        build: impl FnOnce() -> Result<Prepared, GpuError>,
    ) -> BenchResult<Option<f64>> {
        if !self.wants(&id) {
            return Ok(None);
        }
        let (row, seconds) = match build() {
            Ok(prepared) => {
                let time = self.timer.measure(&*prepared.record)?;
                let row = Row::timed(id, prepared.bytes, &time, self.copy_gb_per_s);
                let row = match flops {
                    Some(flops) => row.with_flops(flops, &time, self.fma_gflop_per_s),
                    None => row,
                };
                (row, Some(time.seconds_per_call))
            }
            Err(GpuError::Limit { needed, limit, .. }) => (Row::over_limit(id, needed, limit), None),
            Err(e) => return Err(format!("{} {} {} {}: {e}", id.model, id.kernel, id.ty, id.shape).into()),
        };
        self.push(row);
        Ok(seconds)
    }

    fn wants(&self, id: &CaseId) -> bool {
        let text = format!("{} {} {} {}", id.model, id.kernel, id.ty, id.shape).to_lowercase();
        self.filter.iter().all(|word| text.contains(word.as_str()))
    }

    /// Keeps the row and shows it on stderr as progress (stdout gets the sorted table at the end).
    fn push(&mut self, row: Row) {
        eprintln!("{}", row.markdown());
        self.rows.push(row);
    }
}

fn case_id(model: &'static str, kernel: &'static str, ty: &str, shape: String) -> CaseId {
    CaseId { model, kernel, ty: ty.to_string(), shape }
}
