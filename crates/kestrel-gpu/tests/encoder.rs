//! The encoder kernels (LayerNorm, GELU, RoPE per packed input, bidirectional attention) against
//! kestrel-ops' f64 references on random data, with and without subgroups.

mod common;

use kestrel_gpu::kernels::encoder::{rope_table, token_spans, EncoderAttentionKernel, EncoderRopeKernel, GeluKernel, PackedQkv, QkvLayout};
use kestrel_gpu::kernels::layernorm::{LayerNormKernel, LayerNormOperands};
use kestrel_gpu::{DType, Gpu, Recorder, StepOp, StepParams, StepUniform, Tensor};
use kestrel_ops::params::{RopeConfig, RopeMode};
use kestrel_ops::reference::attention::bidirectional;
use kestrel_ops::reference::norm::layer_norm;
use kestrel_ops::reference::rope::rope;

fn run(gpu: &Gpu, step: &StepUniform, op: &dyn StepOp, n_tokens: usize) {
    let params = StepParams::new(n_tokens as u32, 0, 0);
    step.write(gpu, &params);
    let mut rec = Recorder::new(gpu);
    op.record(&mut rec, &params);
    rec.submit();
}

fn read(gpu: &Gpu, t: &Tensor) -> Vec<f32> {
    pollster::block_on(t.read_f32(gpu)).unwrap()
}

#[test]
fn layernorm_matches_reference() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        let kernel = pollster::block_on(LayerNormKernel::new(&gpu)).unwrap();
        for (seed, &(n, rows, n_tokens)) in [(384, 7, 7), (768, 4, 3), (1, 3, 3), (1000, 5, 2)].iter().enumerate() {
            let mut rng = common::rng(seed as u64);
            // An offset mean, so that a one-pass E[x^2] - E[x]^2 would lose digits.
            let x: Vec<f32> = common::random_vec(&mut rng, rows * n, 2.0).iter().map(|v| v + 3.0).collect();
            let (w, b) = (common::random_vec(&mut rng, n, 1.5), common::random_vec(&mut rng, n, 0.5));
            let eps = 1e-12;
            let x_gpu = Tensor::from_f32(&gpu, "x", &[rows, n], &x).unwrap();
            let w_gpu = Tensor::from_f32(&gpu, "w", &[n], &w).unwrap();
            let b_gpu = Tensor::from_f32(&gpu, "b", &[n], &b).unwrap();
            let out = Tensor::zeros(&gpu, "out", &[rows, n], DType::F32).unwrap();
            let step = StepUniform::new(&gpu);
            let norm = kernel.bind(&gpu, &step, &LayerNormOperands { x: &x_gpu, weight: &w_gpu, bias: &b_gpu, out: &out, eps }).unwrap();
            run(&gpu, &step, &norm, n_tokens);
            let got = read(&gpu, &out);
            let want = layer_norm(&x[..n_tokens * n], &w, &b, eps);
            // The mean of n values within [1, 5) summed in f32 (n / 256 serial adds, then an
            // 8-level tree) is off by at most (n/256 + 8) * 2^-24 * 5 ~ 3e-6 at n = 1000, the
            // centred values by that, and the variance (same sum, values < 2^2) relatively by
            // ~2e-6 (halved by the square root); times |w| < 1.5 and a few roundings: 1e-5 of
            // outputs within ~3 covers it (n = 1 normalizes 0 / sqrt(eps): exactly the bias).
            let what = format!("layernorm n={n} rows={n_tokens}/{rows} subgroups={}", gpu.features.subgroups);
            common::assert_close(&what, &got[..n_tokens * n], &want, 1e-5, 1e-5);
            assert!(got[n_tokens * n..].iter().all(|&v| v == 0.0), "{what}: rows past n_tokens were written");
        }
    }
}

#[test]
fn gelu_matches_the_tanh_formula() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(GeluKernel::new(&gpu)).unwrap();
    let (n, rows, n_tokens) = (1536, 3, 2);
    let mut rng = common::rng(7);
    let mut x = common::random_vec(&mut rng, rows * n, 6.0);
    // The range's edges and beyond, where the CPU's table clamps (0 below -10, x above 10).
    x[..6].copy_from_slice(&[-30.0, -10.0, -1e-3, 0.0, 10.0, 40.0]);
    let x_gpu = Tensor::from_f32(&gpu, "x", &[rows, n], &x).unwrap();
    let step = StepUniform::new(&gpu);
    let gelu = kernel.bind(&gpu, &step, &x_gpu).unwrap();
    run(&gpu, &step, &gelu, n_tokens);
    let got = read(&gpu, &x_gpu);
    let want: Vec<f32> = x[..n_tokens * n]
        .iter()
        .map(|&v| {
            let v = f64::from(v);
            (0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())) as f32
        })
        .collect();
    // x / (1 + e^(-2u)): WGSL's exp is within 3 + 2|y| ULP (y = -2u reaches ~90 at x = -30,
    // where the result is ~1e-38 and only the absolute term matters; for |x| <= 6, |y| <= 25,
    // 53 ULP ~ 3.2e-6), and e/(1 + e) <= 1 passes that relative error on; a few roundings of u:
    // 1e-5 relative. The absolute 1e-6 covers results that round to ~0.
    common::assert_close("gelu", &got[..n_tokens * n], &want, 1e-5, 1e-6);
    assert_eq!(got[n_tokens * n..], x[n_tokens * n..], "gelu: rows past n_tokens changed");
}

/// `(q, k, v)` split out of fused `[q | k | v]` rows of `width` each.
fn split(qkv: &[f32], width: usize) -> [Vec<f32>; 3] {
    std::array::from_fn(|part| qkv.chunks_exact(3 * width).flat_map(|row| &row[part * width..][..width]).copied().collect())
}

#[test]
fn rope_restarts_positions_per_input() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(EncoderRopeKernel::new(&gpu)).unwrap();
    let (n_heads, head_dim) = (4, 64);
    let width = n_heads * head_dim;
    let lengths = [3, 17, 1, 9];
    let n_tokens: usize = lengths.iter().sum();
    let config = RopeConfig { mode: RopeMode::Neox, base: 1000.0, freq_scale: 1.0, freq_factors: None, yarn: None, mscale: 1.0 };
    let mut rng = common::rng(11);
    let qkv = common::random_vec(&mut rng, n_tokens * 3 * width, 1.0);
    let table = rope_table(&config, head_dim, 17).unwrap();
    let qkv_gpu = Tensor::from_f32(&gpu, "qkv", &[n_tokens, 3 * width], &qkv).unwrap();
    let table_gpu = Tensor::from_f32(&gpu, "table", &[table.len()], &table).unwrap();
    let spans: Vec<u32> = token_spans(&lengths).concat();
    let spans_gpu = Tensor::from_u32(&gpu, "spans", &[n_tokens, 2], &spans).unwrap();
    let step = StepUniform::new(&gpu);
    let layout = QkvLayout::fused(n_heads, head_dim);
    let op = kernel.bind(&gpu, &step, &PackedQkv { qkv: &qkv_gpu, layout, spans: &spans_gpu, max_tokens: n_tokens }, &table_gpu).unwrap();
    run(&gpu, &step, &op, n_tokens);
    let got = read(&gpu, &qkv_gpu);
    let mut want = Vec::with_capacity(qkv.len());
    let positions = lengths.iter().flat_map(|&n| 0..n);
    for (row, p) in qkv.chunks_exact(3 * width).zip(positions) {
        want.extend(rope(&row[..width], head_dim, p, &config));
        want.extend(rope(&row[width..2 * width], head_dim, p, &config));
        want.extend_from_slice(&row[2 * width..]);
    }
    // The same f32 cos and sin as the reference's, so each output differs by the roundings of
    // two products and a sum: 2 ULP of values below ~1.5.
    common::assert_close("encoder rope", &got, &want, 3e-7, 3e-7);
}

#[test]
fn attention_stays_within_each_input() {
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        for (seed, &(n_heads, head_dim)) in [(12, 32), (2, 64), (3, 100)].iter().enumerate() {
            let kernel = pollster::block_on(EncoderAttentionKernel::new(&gpu, head_dim)).unwrap();
            let width = n_heads * head_dim;
            // Inputs of one key, of less than a tile, of several tiles (64 keys each).
            let lengths = [5, 130, 1, 64, 23];
            let n_tokens: usize = lengths.iter().sum();
            let mut rng = common::rng(20 + seed as u64);
            let qkv = common::random_vec(&mut rng, n_tokens * 3 * width, 1.0);
            let qkv_gpu = Tensor::from_f32(&gpu, "qkv", &[n_tokens, 3 * width], &qkv).unwrap();
            let spans: Vec<u32> = token_spans(&lengths).concat();
            let spans_gpu = Tensor::from_u32(&gpu, "spans", &[n_tokens, 2], &spans).unwrap();
            let out = Tensor::zeros(&gpu, "out", &[n_tokens, width], DType::F32).unwrap();
            let step = StepUniform::new(&gpu);
            let scale = 1.0 / (head_dim as f32).sqrt();
            let layout = QkvLayout::fused(n_heads, head_dim);
            let op = kernel
                .bind(&gpu, &step, &PackedQkv { qkv: &qkv_gpu, layout, spans: &spans_gpu, max_tokens: n_tokens }, &out, scale)
                .unwrap();
            run(&gpu, &step, &op, n_tokens);
            let got = read(&gpu, &out);
            let [q, k, v] = split(&qkv, width);
            let want = bidirectional(&q, &k, &v, &lengths, n_heads, head_dim, scale);
            // Each score is an f32 dot of head_dim products of values in [-1, 1): off by at most
            // head_dim * 2^-24 * sum|q k| <= 100 * 6e-8 * 100 * 0.1 (scaled) ~ 6e-5 in the worst
            // case, ~1e-6 typically; a weight moves relatively by the score's error (and exp's
            // few ULP), and an output, an average of values within 1, by that much: 2e-5.
            let what = format!("encoder attention heads={n_heads}x{head_dim} subgroups={}", gpu.features.subgroups);
            common::assert_close(&what, &got, &want, 0.0, 2e-5);
        }
    }
}
