//! Attention on the GPU (flash-decoding and prefill) against `reference::attention::attention`.

mod common;

use kestrel_gpu::kernels::attention::{AttentionKernel, AttentionOperands, KvCache};
use kestrel_gpu::{DType, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor};
use kestrel_ops::params::{AttentionShape, KvType, Scores};
use kestrel_ops::reference::attention::attention;

// Outputs are convex combinations of V values in [-1, 1]. The GPU differs from the f64
// reference by f32 dot products (|score| up to ~6), exp's few-ULP error and f32 sums over up
// to 2048 weights and chunk rescalings: an error of a few 1e-7 absolute on the output
// (3.2e-7 measured on lavapipe), mostly independent of the output's size. ~6x margin. The
// score's f32 error grows with the score: the capped case's scores, 16x larger, get 16x the
// absolute bound. An f16 cache is checked against the reference run on the values it holds, so
// the same bounds measure the kernel's own error.
const RTOL: f32 = 1e-5;
const ATOL: f32 = 2e-6;

/// Queries scaled so that scores span a few units: peaked softmax rows, not near-uniform ones.
const Q_SCALE: f32 = 2.0;
const MAX_CTX: usize = 2048;
const MAX_TOKENS: usize = 256;
/// Sequences in the cache, each with its own keys and values.
const SLOTS: usize = 3;
/// The most sequences a decode step runs here.
const QUERIES: usize = 4;

/// A layer's cache filled with random K and V over all of `max_ctx` of every slot (positions past
/// the attended length hold garbage that masking must ignore), and its CPU copy.
struct Layer {
    shape: AttentionShape,
    cache: KvCache,
    k: Vec<f32>,
    v: Vec<f32>,
    q: Tensor,
    out: Tensor,
    step: StepUniform,
    rows: StepRows,
    scores: Scores,
}

impl Layer {
    fn new(gpu: &Gpu, shape: AttentionShape, kv: KvType, scores: Scores, seed: u64) -> Self {
        let mut rng = common::rng(seed);
        let stored = |x: Vec<f32>| x.into_iter().map(|x| kv.stored(x)).collect::<Vec<f32>>();
        let k = stored(common::random_vec(&mut rng, SLOTS * shape.cache_len(), 1.0));
        let v = stored(common::random_vec(&mut rng, SLOTS * shape.cache_len(), 1.0));
        let cache = KvCache::new(gpu, "cache", shape, kv, SLOTS).unwrap();
        gpu.write(&cache.k.buffer, 0, &kv.encode(&k));
        gpu.write(&cache.v.buffer, 0, &kv.encode(&v));
        let q = Tensor::zeros(gpu, "q", &[MAX_TOKENS, shape.q_width()], DType::F32).unwrap();
        let out = Tensor::zeros(gpu, "out", &[MAX_TOKENS, shape.q_width()], DType::F32).unwrap();
        let rows = StepRows::new(gpu, MAX_TOKENS).unwrap();
        Self { shape, cache, k, v, q, out, step: StepUniform::new(gpu), rows, scores }
    }

    /// Slot `slot`'s keys and values.
    fn slot(&self, slot: usize) -> (&[f32], &[f32]) {
        let len = self.shape.cache_len();
        (&self.k[slot * len..][..len], &self.v[slot * len..][..len])
    }

    /// Writes a random query for each `(slot, pos)` of `queries` (a prefill chunk: one slot's
    /// consecutive positions; a decode step: one query per sequence), runs `attn` and compares
    /// each output row with the reference over its slot.
    fn check(&self, gpu: &Gpu, queries: &[[u32; 2]], seed: u64, attn: &impl StepOp) {
        let width = self.shape.q_width();
        let q = common::random_vec(&mut common::rng(seed), queries.len() * width, Q_SCALE);
        gpu.write(&self.q.buffer, 0, bytemuck::cast_slice(&q));
        let last = queries.iter().map(|[_, pos]| *pos).max().unwrap_or(0);
        // Grids follow the most advanced query; each query's own position is in its row.
        let params = StepParams { n_tokens: queries.len() as u32, pos: last, kv_len: last + 1, draw: 0 };
        self.step.write(gpu, &params);
        self.rows.write(gpu, queries).unwrap();
        let mut rec = Recorder::new(gpu);
        attn.record(&mut rec, &params);
        rec.submit();
        let got = pollster::block_on(self.out.read_f32(gpu)).unwrap();
        let what = format!(
            "attention {:?} {:?} {} cache queries {queries:?} subgroups={}",
            self.shape,
            self.scores,
            self.cache.kv.name(),
            gpu.features.subgroups
        );
        let atol = if self.scores.softcap.is_some() { 16.0 * ATOL } else { ATOL };
        for (t, [slot, pos]) in queries.iter().enumerate() {
            let (k, v) = self.slot(*slot as usize);
            let want = attention(&self.shape, &q[t * width..][..width], k, v, *pos as usize, &self.scores);
            common::assert_close(&format!("{what} query {t}"), &got[t * width..][..width], &want, RTOL, atol);
        }
    }
}

/// `n` consecutive positions from `pos` in `slot`.
fn run(slot: u32, pos: usize, n: usize) -> Vec<[u32; 2]> {
    (pos..pos + n).map(|p| [slot, p as u32]).collect()
}

fn plain(shape: AttentionShape) -> Scores {
    Scores::scaled(1.0 / (shape.head_dim as f32).sqrt())
}

/// One query at each of `kv_lens` (cycling through the slots), then each batch of `(slot, pos)`
/// queries in one step (the decode kernels bound for `QUERIES` sequences).
fn decode(gpu: &Gpu, shape: AttentionShape, kv: KvType, scores: Scores, kv_lens: &[usize], batches: &[&[[u32; 2]]]) {
    let kernel = pollster::block_on(AttentionKernel::new(gpu, shape.head_dim, kv)).unwrap();
    let layer = Layer::new(gpu, shape, kv, scores, 1);
    let attn = kernel
        .bind_decode(
            gpu,
            &AttentionOperands { q: &layer.q, cache: &layer.cache, out: &layer.out, scores: &layer.scores, rows: &layer.rows },
            QUERIES,
        )
        .unwrap();
    for (i, &kv_len) in kv_lens.iter().enumerate() {
        layer.check(gpu, &run((i % SLOTS) as u32, kv_len - 1, 1), kv_len as u64, &attn);
    }
    for (i, batch) in batches.iter().enumerate() {
        layer.check(gpu, batch, 7 + i as u64, &attn);
    }
}

/// Chunks of (slot, n_tokens, pos): each sees its slot's cache up to its own positions.
fn prefill(gpu: &Gpu, shape: AttentionShape, kv: KvType, scores: Scores, chunks: &[(u32, usize, usize)]) {
    let kernel = pollster::block_on(AttentionKernel::new(gpu, shape.head_dim, kv)).unwrap();
    let layer = Layer::new(gpu, shape, kv, scores, 2);
    let attn = kernel
        .bind_prefill(
            gpu,
            &layer.step,
            &AttentionOperands { q: &layer.q, cache: &layer.cache, out: &layer.out, scores: &layer.scores, rows: &layer.rows },
        )
        .unwrap();
    for &(slot, n_tokens, pos) in chunks {
        layer.check(gpu, &run(slot, pos, n_tokens), (n_tokens + pos) as u64, &attn);
    }
}

const SMALL: AttentionShape = AttentionShape { n_heads: 9, n_kv_heads: 3, head_dim: 64, max_ctx: MAX_CTX };
const BIG: AttentionShape = AttentionShape { n_heads: 32, n_kv_heads: 8, head_dim: 128, max_ctx: MAX_CTX };
/// Phi-3-mini's 96-dimension heads (which do not divide the decode chunk's 256 threads).
const PHI3: AttentionShape = AttentionShape { n_heads: 4, n_kv_heads: 4, head_dim: 96, max_ctx: MAX_CTX };
/// Gemma's 256-dimension heads (smaller prefill tiles).
const GEMMA: AttentionShape = AttentionShape { n_heads: 4, n_kv_heads: 1, head_dim: 256, max_ctx: MAX_CTX };

/// Gemma 2's soft cap of 50, on scores scaled up 16x so that it bends them (a score of 20 caps
/// to 19), with a 300-key window: the window cuts through chunks and prefill blocks at every
/// tested length past it.
fn capped_window(shape: AttentionShape) -> Scores {
    Scores { scale: 16.0 / (shape.head_dim as f32).sqrt(), softcap: Some(50.0), window: Some(300) }
}

#[test]
fn decode_matches_reference() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        for kv in [KvType::F16, KvType::F32] {
            // Batches mix slots and lengths: the grid covers the longest, the others' extra
            // chunks do nothing.
            let batches: [&[[u32; 2]]; 2] = [&[[0, 999], [2, 0], [1, 2047], [0, 300]], &[[2, 255], [1, 256]]];
            decode(&gpu, SMALL, kv, plain(SMALL), &[1, 2, 31, 255, 256, 257, 1000, 2048], &batches);
            decode(&gpu, BIG, kv, plain(BIG), &[1, 257, 2048], &batches[..1]);
            decode(&gpu, PHI3, kv, plain(PHI3), &[1, 257, 700], &batches[1..]);
            decode(&gpu, GEMMA, kv, plain(GEMMA), &[1, 257, 700], &batches[1..]);
            // From 556 keys on, the chunks before the window are skipped (556: the window starts
            // on chunk 1's first key; 812: on chunk 2's; 813: one key later). In a batch, each
            // query skips its own.
            let windowed: [&[[u32; 2]]; 1] = [&[[1, 298], [0, 2047], [2, 555], [1, 812]]];
            decode(&gpu, SMALL, kv, capped_window(SMALL), &[1, 299, 300, 301, 555, 556, 812, 813, 2048], &windowed);
        }
    }
}

#[test]
fn prefill_matches_reference() {
    let chunks = [(0, 1, 0), (1, 7, 0), (2, 64, 0), (0, 200, 0), (1, 57, 200), (2, 1, 2047)];
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        for kv in [KvType::F16, KvType::F32] {
            prefill(&gpu, SMALL, kv, plain(SMALL), &chunks);
            prefill(&gpu, BIG, kv, plain(BIG), &[(0, 37, 0), (2, 13, 300)]);
            prefill(&gpu, PHI3, kv, plain(PHI3), &[(1, 37, 0), (0, 13, 300)]);
            prefill(&gpu, GEMMA, kv, plain(GEMMA), &[(2, 37, 0), (1, 13, 300)]);
            prefill(&gpu, SMALL, kv, capped_window(SMALL), &[(0, 200, 0), (1, 200, 200), (2, 57, 420), (0, 1, 2047)]);
        }
    }
}

#[test]
fn attention_rejects_bad_shapes() {
    let gpu = common::gpu();
    assert!(matches!(pollster::block_on(AttentionKernel::new(&gpu, 80, KvType::F16)), Err(GpuError::InvalidArgs(_))));
    let scores = Scores::scaled(0.125);
    let kernel = pollster::block_on(AttentionKernel::new(&gpu, 64, KvType::F16)).unwrap();
    let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 64, max_ctx: 16 };
    let cache = KvCache::new(&gpu, "cache", shape, KvType::F16, 2).unwrap();
    let step = StepUniform::new(&gpu);
    let rows = StepRows::new(&gpu, 2).unwrap();
    let q = Tensor::zeros(&gpu, "q", &[2, 256], DType::F32).unwrap();
    let wrong = Tensor::zeros(&gpu, "out", &[2, 128], DType::F32).unwrap();
    assert!(matches!(
        kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &cache, out: &wrong, scores: &scores, rows: &rows }, 1),
        Err(GpuError::InvalidArgs(_))
    ));
    assert!(matches!(
        kernel.bind_prefill(&gpu, &step, &AttentionOperands { q: &wrong, cache: &cache, out: &wrong, scores: &scores, rows: &rows }),
        Err(GpuError::InvalidArgs(_))
    ));
    let out = Tensor::zeros(&gpu, "out", &[2, 256], DType::F32).unwrap();
    assert!(kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &scores, rows: &rows }, 2).is_ok());
    // More sequences than q's rows, or than the step rows hold.
    assert!(matches!(
        kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &scores, rows: &rows }, 3),
        Err(GpuError::InvalidArgs(_))
    ));
    let one_row = StepRows::new(&gpu, 1).unwrap();
    assert!(matches!(
        kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &scores, rows: &one_row }, 2),
        Err(GpuError::InvalidArgs(_))
    ));
    for bad in [Scores { window: Some(0), ..scores }, Scores { softcap: Some(-1.0), ..scores }, Scores::scaled(f32::NAN)] {
        assert!(
            matches!(
                kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &cache, out: &out, scores: &bad, rows: &rows }, 1),
                Err(GpuError::InvalidArgs(_))
            ),
            "{bad:?}"
        );
    }
    let f32_cache = KvCache::new(&gpu, "cache", shape, KvType::F32, 1).unwrap();
    assert!(
        matches!(
            kernel.bind_decode(&gpu, &AttentionOperands { q: &q, cache: &f32_cache, out: &out, scores: &scores, rows: &rows }, 1),
            Err(GpuError::InvalidArgs(_))
        ),
        "cache type"
    );
    let bad_cache = AttentionShape { n_heads: 4, n_kv_heads: 3, ..shape };
    assert!(matches!(KvCache::new(&gpu, "bad", bad_cache, KvType::F16, 1), Err(GpuError::InvalidArgs(_))));
    assert!(matches!(KvCache::new(&gpu, "no slots", shape, KvType::F16, 0), Err(GpuError::InvalidArgs(_))));
}
