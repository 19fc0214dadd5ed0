//! RMSNorm on the GPU against `reference::norm::rmsnorm`.

mod common;

use kestrel_gpu::kernels::rmsnorm::{HeadNormKernel, HeadSpan, RmsNormKernel};
use kestrel_gpu::{DType, Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor};
use kestrel_ops::reference::norm::rmsnorm;

// Each output is x * inv_rms * w: two roundings of the products plus inverseSqrt (2 ULP) and the
// f32 tree sum of squares (relative error ~ log2(n) * 2^-24 for n <= 2048, halved by the sqrt).
// That is under 1.5e-6 relative; the absolute term only covers outputs that round to ~0.
const RTOL: f32 = 2e-6;
const ATOL: f32 = 1e-7;

/// Normalizes `n_tokens` rows of a `max_rows`-row buffer and checks them; rows past `n_tokens`
/// must stay untouched (zero).
fn check(gpu: &Gpu, kernel: &RmsNormKernel, n: usize, max_rows: usize, n_tokens: usize, seed: u64) {
    let mut rng = common::rng(seed);
    let x = common::random_vec(&mut rng, max_rows * n, 2.0);
    let w = common::random_vec(&mut rng, n, 1.5);
    let eps = 1e-5;
    let x_gpu = Tensor::from_f32(gpu, "x", &[max_rows, n], &x).unwrap();
    let w_gpu = Tensor::from_f32(gpu, "w", &[n], &w).unwrap();
    let out = Tensor::zeros(gpu, "out", &[max_rows, n], DType::F32).unwrap();
    let step = StepUniform::new(gpu);
    let norm = kernel.bind(gpu, &step, &x_gpu, &w_gpu, &out, eps).unwrap();
    let params = StepParams::new(n_tokens as u32, 0, 0);
    step.write(gpu, &params);
    let mut rec = Recorder::new(gpu);
    norm.record(&mut rec, &params);
    rec.submit();
    let got = pollster::block_on(out.read_f32(gpu)).unwrap();
    let want = rmsnorm(&x[..n_tokens * n], &w, eps);
    let what = format!("rmsnorm n={n} rows={n_tokens}/{max_rows} subgroups={}", gpu.features.subgroups);
    common::assert_close(&what, &got[..n_tokens * n], &want, RTOL, ATOL);
    assert!(got[n_tokens * n..].iter().all(|&v| v == 0.0), "{what}: rows past n_tokens were written");
}

#[test]
fn rmsnorm_matches_reference() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        let kernel = pollster::block_on(RmsNormKernel::new(&gpu)).unwrap();
        for (i, &(n, max_rows, n_tokens)) in
            [(576, 6, 6), (2048, 4, 3), (1, 5, 5), (33, 9, 7), (1000, 3, 2), (576, 8, 1)].iter().enumerate()
        {
            check(&gpu, &kernel, n, max_rows, n_tokens, i as u64);
        }
    }
}

/// The accumulating norm (Gemma's post-norms): `out += norm(x) * w` over `n_tokens` rows; rows
/// past `n_tokens` keep their values.
#[test]
fn accumulating_rmsnorm_adds_into_out() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        let kernel = pollster::block_on(RmsNormKernel::accumulating(&gpu)).unwrap();
        let (n, max_rows, n_tokens) = (640, 4, 3);
        let mut rng = common::rng(60);
        let x = common::random_vec(&mut rng, max_rows * n, 2.0);
        let w = common::random_vec(&mut rng, n, 1.5);
        let residual = common::random_vec(&mut rng, max_rows * n, 3.0);
        let eps = 1e-6;
        let x_gpu = Tensor::from_f32(&gpu, "x", &[max_rows, n], &x).unwrap();
        let w_gpu = Tensor::from_f32(&gpu, "w", &[n], &w).unwrap();
        let out = Tensor::from_f32(&gpu, "residual", &[max_rows, n], &residual).unwrap();
        let step = StepUniform::new(&gpu);
        let norm = kernel.bind(&gpu, &step, &x_gpu, &w_gpu, &out, eps).unwrap();
        let params = StepParams::new(n_tokens as u32, 0, 0);
        step.write(&gpu, &params);
        let mut rec = Recorder::new(&gpu);
        norm.record(&mut rec, &params);
        rec.submit();
        let got = pollster::block_on(out.read_f32(&gpu)).unwrap();
        let normed = rmsnorm(&x[..n_tokens * n], &w, eps);
        let want: Vec<f32> = residual.iter().zip(&normed).map(|(r, v)| r + v).collect();
        let what = format!("accumulating rmsnorm subgroups={}", gpu.features.subgroups);
        // One more rounding (the add) on top of the norm's bound, relative to the sum.
        common::assert_close(&what, &got[..n_tokens * n], &want, RTOL, 4.0 * ATOL);
        assert_eq!(got[n_tokens * n..], residual[n_tokens * n..], "{what}: rows past n_tokens changed");
    }
}

#[test]
fn rmsnorm_rejects_bad_shapes() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(RmsNormKernel::new(&gpu)).unwrap();
    let step = StepUniform::new(&gpu);
    let x = Tensor::zeros(&gpu, "x", &[2, 8], DType::F32).unwrap();
    let w = Tensor::zeros(&gpu, "w", &[7], DType::F32).unwrap();
    let out = Tensor::zeros(&gpu, "out", &[2, 8], DType::F32).unwrap();
    assert!(matches!(kernel.bind(&gpu, &step, &x, &w, &out, 1e-5), Err(GpuError::InvalidArgs(_))));
    let w = Tensor::zeros(&gpu, "w", &[8], DType::F32).unwrap();
    assert!(matches!(kernel.bind(&gpu, &step, &x, &w, &x, 1e-5), Err(GpuError::InvalidArgs(_))));
    assert!(kernel.bind(&gpu, &step, &x, &w, &out, 1e-5).is_ok());
}

/// The per-head norm in place (Qwen3's Q and K norms on the fused QKV row): the span's heads of
/// each of `n_tokens` rows normalized like rows of `head_dim` values; everything else of the
/// buffer (other heads, rows past `n_tokens`) left exactly as it was.
#[test]
fn head_rmsnorm_normalizes_its_span_in_place() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        let kernel = pollster::block_on(HeadNormKernel::new(&gpu)).unwrap();
        // (head_dim, q heads, kv heads, max rows, n_tokens): Qwen3's 128 with GQA, a decode row.
        for (i, &(hd, nq, nkv, max_rows, n_tokens)) in [(128, 4, 2, 5, 5), (64, 8, 2, 4, 1), (32, 3, 3, 3, 2)].iter().enumerate() {
            let width = (nq + 2 * nkv) * hd;
            let mut rng = common::rng(50 + i as u64);
            let x = common::random_vec(&mut rng, max_rows * width, 2.0);
            let w = common::random_vec(&mut rng, hd, 1.5);
            let eps = 1e-6;
            let x_gpu = Tensor::from_f32(&gpu, "qkv", &[max_rows, width], &x).unwrap();
            let w_gpu = Tensor::from_f32(&gpu, "k_norm", &[hd], &w).unwrap();
            let step = StepUniform::new(&gpu);
            // The K heads: they sit between Q and V, so both neighbours must stay untouched.
            let span = HeadSpan { offset: nq * hd, heads: nkv, head_dim: hd };
            let norm = kernel.bind(&gpu, &step, &x_gpu, &w_gpu, span, eps).unwrap();
            let params = StepParams::new(n_tokens as u32, 0, 0);
            step.write(&gpu, &params);
            let mut rec = Recorder::new(&gpu);
            norm.record(&mut rec, &params);
            rec.submit();
            let got = pollster::block_on(x_gpu.read_f32(&gpu)).unwrap();
            let what = format!("head rmsnorm hd={hd} heads={nkv} rows={n_tokens}/{max_rows} subgroups={}", gpu.features.subgroups);
            let mut want = x.clone();
            for row in want.chunks_exact_mut(width).take(n_tokens) {
                let span = &mut row[nq * hd..][..nkv * hd];
                let normed = rmsnorm(span, &w, eps);
                span.copy_from_slice(&normed);
            }
            for (r, (g, w)) in got.chunks_exact(width).zip(want.chunks_exact(width)).enumerate() {
                let (k0, k1) = (nq * hd, (nq + nkv) * hd);
                assert_eq!(g[..k0], w[..k0], "{what}: Q of row {r} changed");
                assert_eq!(g[k1..], w[k1..], "{what}: V of row {r} changed");
                if r < n_tokens {
                    common::assert_close(&format!("{what} row {r}"), &g[k0..k1], &w[k0..k1], RTOL, ATOL);
                } else {
                    assert_eq!(g[k0..k1], w[k0..k1], "{what}: row {r} past n_tokens changed");
                }
            }
        }
    }
}

#[test]
fn head_rmsnorm_rejects_bad_spans() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(HeadNormKernel::new(&gpu)).unwrap();
    let step = StepUniform::new(&gpu);
    let x = Tensor::zeros(&gpu, "x", &[2, 32], DType::F32).unwrap();
    let w = Tensor::zeros(&gpu, "w", &[8], DType::F32).unwrap();
    let span = |offset, heads| HeadSpan { offset, heads, head_dim: 8 };
    assert!(matches!(kernel.bind(&gpu, &step, &x, &w, span(8, 4), 1e-6), Err(GpuError::InvalidArgs(_))));
    assert!(matches!(kernel.bind(&gpu, &step, &x, &w, span(0, 0), 1e-6), Err(GpuError::InvalidArgs(_))));
    let w7 = Tensor::zeros(&gpu, "w", &[7], DType::F32).unwrap();
    assert!(matches!(kernel.bind(&gpu, &step, &x, &w7, span(0, 4), 1e-6), Err(GpuError::InvalidArgs(_))));
    assert!(kernel.bind(&gpu, &step, &x, &w, span(8, 3), 1e-6).is_ok());
}
