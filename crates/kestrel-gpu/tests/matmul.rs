//! Matvec (decode) and tiled matmul (prefill) kernels, with their epilogues, against the CPU
//! reference computed from the same quantized bytes.
//!
//! Tolerance: dequantization is exact on both sides (a 4- to 8-bit integer times an f16 scale
//! fits in f32, and so does a K-quant's d·scale·q: an 11-bit significand times at most 13 bits;
//! the `+ m` of Q4_1, Q5_1, Q4_K and Q5_K rounds once either way after an exact product), so GPU
//! and reference differ only in the order of the f32 summation. That error is bounded by a multiple of ε·Σ_k|x_k·w_k|
//! (ε = 2^-24 ≈ 6e-8), the honest scale for a dot product whose terms cancel. We allow
//! |gpu - ref| <= 2e-6·Σ_k|x_k·w_k| + 1e-6 (≈ 33ε): the largest error seen over all shapes here
//! (K up to 8192) is ≈ 2.4e-7·Σ|x_k·w_k|, 8x below, while any decoding bug (a wrong scale,
//! nibble, sign or column) moves results by a sizeable fraction of Σ|x_k·w_k|.

mod common;

use kestrel_gguf::{quant, GgmlType};
use kestrel_gpu::kernels::matmul::{MatmulDispatch, MatmulKernel, SwigluMatmulKernel};
use kestrel_gpu::kernels::matvec::{MatvecKernel, SwigluMatvecKernel};
use kestrel_gpu::kernels::{Epilogue, GateUpOperands, Operands, OutputColumns};
use kestrel_gpu::{Gpu, GpuError, Recorder, StepOp, StepParams, StepUniform, Tensor, WeightTensor};
use kestrel_ops::params::GateActivation;
use kestrel_ops::reference::matmul::{dequantize_weights, gated, matmul};
use rand::rngs::StdRng;

/// Relative tolerance against Σ|x_k·w_k| (see the module comment).
const REL: f32 = 2e-6;
const ABS: f32 = 1e-6;

/// Value of the output elements a kernel must not touch.
const SENTINEL: f32 = 1234.5;

/// (N, K) for the types of 32-weight blocks; the dense types also get row lengths that are not
/// whole units of 8.
// The matvec splits a workgroup into slots of threads, one row each, sized to the row length: (20001,
// 64) packs 32 short rows into each workgroup, the last only partly filled; (12289, 1024) gives
// each workgroup 3 passes of 2 rows (tall matrices such as the LM head), the last workgroup one
// row in its first pass and nothing after.
const SHAPES: [(usize, usize); 10] =
    [(1, 32), (7, 96), (33, 544), (576, 576), (1536, 576), (576, 1536), (3, 8192), (100, 8192), (20001, 64), (12289, 1024)];
const DENSE_SHAPES: [(usize, usize); 3] = [(3, 2), (5, 38), (9, 70)];
/// (N, K) for the K-quants, whose rows are whole super-blocks of 256: one, two, three (an odd
/// count: Q6_K pairs super-blocks' scales) and six super-blocks, long rows, and tall matrices
/// (several rows per matvec workgroup, several passes).
const K_SHAPES: [(usize, usize); 8] = [(1, 256), (7, 512), (33, 768), (576, 1536), (1536, 256), (3, 8192), (20001, 256), (12289, 1024)];

/// (N, K, M) for the matmul: every tile edge case, M up to 512 (K_MATMUL_SHAPES: the same for the
/// K-quants).
const MATMUL_SHAPES: [(usize, usize, usize); 9] = [
    (1, 32, 1),
    (7, 96, 3),
    (33, 544, 17),
    (576, 576, 130),
    (1536, 576, 64),
    (576, 1536, 17),
    (3, 8192, 3),
    (100, 8192, 17),
    (33, 96, 512),
];
const DENSE_MATMUL_SHAPES: [(usize, usize, usize); 2] = [(5, 38, 33), (70, 70, 3)];
const K_MATMUL_SHAPES: [(usize, usize, usize); 7] =
    [(1, 256, 1), (7, 512, 3), (33, 768, 17), (576, 1536, 33), (1536, 256, 130), (100, 8192, 17), (33, 256, 512)];

fn is_dense(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16)
}

fn is_k_quant(ty: GgmlType) -> bool {
    ty.block_size() == 256
}

/// A quantized weight matrix and its exact f32 values.
struct Weights {
    ty: GgmlType,
    n: usize,
    k: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

impl Weights {
    fn random(rng: &mut StdRng, ty: GgmlType, n: usize, k: usize) -> Self {
        let bytes = quant::quantize(ty, &common::random_vec(rng, n * k, 1.0)).unwrap();
        let values = dequantize_weights(ty, &bytes, n, k).unwrap();
        Self { ty, n, k, bytes, values }
    }

    fn upload(&self, gpu: &Gpu) -> WeightTensor {
        WeightTensor::from_gguf_bytes(gpu, "w", self.ty, self.n, self.k, &self.bytes).unwrap()
    }

    fn abs(&self) -> Vec<f32> {
        self.values.iter().map(|v| v.abs()).collect()
    }
}

fn abs(v: &[f32]) -> Vec<f32> {
    v.iter().map(|v| v.abs()).collect()
}

/// The allowed error of each dot product, from its Σ|x_k·w_k|.
fn dot_bounds(abs_sums: &[f32]) -> Vec<f32> {
    abs_sums.iter().map(|s| REL * s + ABS).collect()
}

/// Asserts |got - want| <= bound elementwise.
fn assert_within(what: &str, got: &[f32], want: &[f32], bound: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(g.is_finite() && (g - w).abs() <= b, "{what}: element {i}: got {g}, want {w} (bound {b})");
    }
}

fn devices() -> [(String, Gpu); 2] {
    [common::gpu(), common::gpu_without_subgroups()].map(|gpu| {
        let subgroups = if gpu.features.subgroups { "subgroups" } else { "no subgroups" };
        let m = gpu.info.kernels.matvec;
        (format!("{subgroups}, matvec {} slices x {} rows", m.slices, m.rows_per_thread), gpu)
    })
}

/// Runs a bound matvec and returns the first `n` outputs.
fn run(gpu: &Gpu, dispatch: &kestrel_gpu::Dispatch, y: &Tensor, n: usize) -> Vec<f32> {
    let mut rec = Recorder::new(gpu);
    dispatch.record(&mut rec);
    rec.submit();
    pollster::block_on(y.read_f32(gpu)).unwrap()[..n].to_vec()
}

/// Runs a bound matmul for `m` tokens; returns all of y.
fn run_matmul(gpu: &Gpu, step: &StepUniform, dispatch: &MatmulDispatch, y: &Tensor, m: usize) -> Vec<f32> {
    let params = StepParams::new(m as u32, 0, 0);
    step.write(gpu, &params);
    let mut rec = Recorder::new(gpu);
    dispatch.record(&mut rec, &params);
    rec.submit();
    pollster::block_on(y.read_f32(gpu)).unwrap()
}

fn check_matvec(ty: GgmlType) {
    let mut rng = common::rng(ty.id().into());
    let shapes = match ty {
        _ if is_k_quant(ty) => K_SHAPES.to_vec(),
        _ if is_dense(ty) => [&SHAPES[..], &DENSE_SHAPES].concat(),
        _ => SHAPES.to_vec(),
    };
    let cases: Vec<_> = shapes
        .into_iter()
        .map(|(n, k)| {
            let w = Weights::random(&mut rng, ty, n, k);
            let x = common::random_vec(&mut rng, k, 1.0);
            let want = matmul(&x, 1, &w.values, n, k);
            let bound = dot_bounds(&matmul(&abs(&x), 1, &w.abs(), n, k));
            (w, x, want, bound)
        })
        .collect();
    for (device, gpu) in devices() {
        let kernel = pollster::block_on(MatvecKernel::new(&gpu, ty, Epilogue::NONE)).unwrap();
        for (w, x, want, bound) in &cases {
            let (n, k) = (w.n, w.k);
            let x_t = Tensor::from_f32(&gpu, "x", &[k], x).unwrap();
            // One extra output element: it must stay untouched.
            let y = Tensor::from_f32(&gpu, "y", &[n + 1], &vec![SENTINEL; n + 1]).unwrap();
            let dispatch = kernel.bind(&gpu, &Operands::whole(&w.upload(&gpu), &x_t, &y, None)).unwrap();
            let got = run(&gpu, &dispatch, &y, n + 1);
            let what = format!("matvec {ty} {n}x{k} ({device})");
            assert_within(&what, &got[..n], want, bound);
            assert_eq!(got[n], SENTINEL, "{what}: wrote past N");
        }
    }
}

fn check_matmul(ty: GgmlType) {
    let mut rng = common::rng(100 + u64::from(ty.id()));
    let shapes = match ty {
        _ if is_k_quant(ty) => K_MATMUL_SHAPES.to_vec(),
        _ if is_dense(ty) => [&MATMUL_SHAPES[..], &DENSE_MATMUL_SHAPES].concat(),
        _ => MATMUL_SHAPES.to_vec(),
    };
    let cases: Vec<_> = shapes
        .into_iter()
        .map(|(n, k, m)| {
            let w = Weights::random(&mut rng, ty, n, k);
            let x = common::random_vec(&mut rng, m * k, 1.0);
            let want = matmul(&x, m, &w.values, n, k);
            let bound = dot_bounds(&matmul(&abs(&x), m, &w.abs(), n, k));
            (w, m, x, want, bound)
        })
        .collect();
    for (device, gpu) in devices() {
        let kernel = pollster::block_on(MatmulKernel::new(&gpu, ty, Epilogue::NONE)).unwrap();
        let step = StepUniform::new(&gpu);
        for (w, m, x, want, bound) in &cases {
            let (n, k, m) = (w.n, w.k, *m);
            // Buffers sized for more tokens than this chunk, as the model allocates them; the
            // extra x rows hold garbage and the extra y rows must stay untouched.
            let max_tokens = m + 2;
            let mut x_full = x.clone();
            x_full.extend(common::random_vec(&mut rng, 2 * k, 100.0));
            let x_t = Tensor::from_f32(&gpu, "x", &[max_tokens, k], &x_full).unwrap();
            let y = Tensor::from_f32(&gpu, "y", &[max_tokens, n], &vec![SENTINEL; max_tokens * n]).unwrap();
            let step_max = max_tokens as u32;
            let dispatch = kernel.bind(&gpu, &Operands::whole(&w.upload(&gpu), &x_t, &y, None), &step, step_max).unwrap();
            let got = run_matmul(&gpu, &step, &dispatch, &y, m);
            let what = format!("matmul {ty} M={m} {n}x{k} ({device})");
            assert_within(&what, &got[..m * n], want, bound);
            assert!(got[m * n..].iter().all(|&v| v == SENTINEL), "{what}: wrote past token M");
        }
    }
}

#[test]
fn matvec_f32() {
    check_matvec(GgmlType::F32);
}

#[test]
fn matvec_f16() {
    check_matvec(GgmlType::F16);
}

#[test]
fn matvec_q8_0() {
    check_matvec(GgmlType::Q8_0);
}

#[test]
fn matvec_q4_0() {
    check_matvec(GgmlType::Q4_0);
}

#[test]
fn matvec_q4_1() {
    check_matvec(GgmlType::Q4_1);
}

#[test]
fn matvec_q5_0() {
    check_matvec(GgmlType::Q5_0);
}

#[test]
fn matvec_q5_1() {
    check_matvec(GgmlType::Q5_1);
}

#[test]
fn matvec_q4_k() {
    check_matvec(GgmlType::Q4_K);
}

#[test]
fn matvec_q5_k() {
    check_matvec(GgmlType::Q5_K);
}

#[test]
fn matvec_q6_k() {
    check_matvec(GgmlType::Q6_K);
}

#[test]
fn matmul_f32() {
    check_matmul(GgmlType::F32);
}

#[test]
fn matmul_f16() {
    check_matmul(GgmlType::F16);
}

#[test]
fn matmul_q8_0() {
    check_matmul(GgmlType::Q8_0);
}

#[test]
fn matmul_q4_0() {
    check_matmul(GgmlType::Q4_0);
}

#[test]
fn matmul_q4_1() {
    check_matmul(GgmlType::Q4_1);
}

#[test]
fn matmul_q5_0() {
    check_matmul(GgmlType::Q5_0);
}

#[test]
fn matmul_q5_1() {
    check_matmul(GgmlType::Q5_1);
}

#[test]
fn matmul_q4_k() {
    check_matmul(GgmlType::Q4_K);
}

#[test]
fn matmul_q5_k() {
    check_matmul(GgmlType::Q5_K);
}

#[test]
fn matmul_q6_k() {
    check_matmul(GgmlType::Q6_K);
}

/// Bias and in-place residual add (together and apart), decode and prefill:
/// y = residual + x·Wᵀ + b, the residual being y's previous contents.
#[test]
fn bias_and_residual_epilogues() {
    let mut rng = common::rng(7);
    for (ty, n, k, m) in [
        (GgmlType::Q4_1, 33, 544, 17),
        (GgmlType::F16, 33, 544, 17),
        (GgmlType::Q5_0, 33, 544, 17),
        (GgmlType::Q5_1, 33, 544, 17),
        (GgmlType::Q4_K, 33, 512, 17),
        (GgmlType::Q5_K, 33, 512, 17),
        (GgmlType::Q6_K, 33, 512, 17),
    ] {
        let w = Weights::random(&mut rng, ty, n, k);
        let x = common::random_vec(&mut rng, m * k, 1.0);
        let residual = common::random_vec(&mut rng, m * n, 10.0);
        let bias = common::random_vec(&mut rng, n, 10.0);
        let product = matmul(&x, m, &w.values, n, k);
        let dot_bound = dot_bounds(&matmul(&abs(&x), m, &w.abs(), n, k));
        for (device, gpu) in devices() {
            let weights = w.upload(&gpu);
            let step = StepUniform::new(&gpu);
            let x_t = Tensor::from_f32(&gpu, "x", &[m, k], &x).unwrap();
            let b_t = Tensor::from_f32(&gpu, "bias", &[n], &bias).unwrap();
            for epilogue in [Epilogue::BIAS, Epilogue::ACCUMULATE, Epilogue { bias: true, accumulate: true }] {
                let want: Vec<f32> = (0..m * n)
                    .map(|i| {
                        let b = if epilogue.bias { bias[i % n] } else { 0.0 };
                        let r = if epilogue.accumulate { residual[i] } else { 0.0 };
                        product[i] + b + r
                    })
                    .collect();
                // The two additions round once more each, relative to |b| + |r| <= 20 and the result.
                let bound: Vec<f32> = (0..m * n).map(|i| dot_bound[i] + 3e-7 * (want[i].abs() + 20.0)).collect();
                let what = format!("{ty} {epilogue:?} ({device})");

                let kernel = pollster::block_on(MatvecKernel::new(&gpu, ty, epilogue)).unwrap();
                let y = Tensor::from_f32(&gpu, "y", &[n], &residual[..n]).unwrap();
                let dispatch = kernel.bind(&gpu, &Operands::whole(&weights, &x_t, &y, epilogue.bias.then_some(&b_t))).unwrap();
                assert_within(&format!("matvec {what}"), &run(&gpu, &dispatch, &y, n), &want[..n], &bound[..n]);

                let kernel = pollster::block_on(MatmulKernel::new(&gpu, ty, epilogue)).unwrap();
                let y = Tensor::from_f32(&gpu, "y", &[m, n], &residual).unwrap();
                let dispatch =
                    kernel.bind(&gpu, &Operands::whole(&weights, &x_t, &y, epilogue.bias.then_some(&b_t)), &step, m as u32).unwrap();
                assert_within(&format!("matmul {what}"), &run_matmul(&gpu, &step, &dispatch, &y, m), &want, &bound);
            }
        }
    }
}

/// Three products of different weight types filling one activation row side by side, as Q, K and
/// V do when their types differ: each writes only its columns of every token row, with its
/// epilogue (bias on the first, the residual add on the last).
#[test]
fn products_write_their_output_columns() {
    let mut rng = common::rng(11);
    let (k, m) = (544, 19);
    let parts = [(GgmlType::Q5_0, 40, Epilogue::BIAS), (GgmlType::Q8_0, 8, Epilogue::NONE), (GgmlType::Q4_1, 8, Epilogue::ACCUMULATE)];
    let stride: usize = parts.iter().map(|p| p.1).sum::<usize>() + 3; // 3 columns nobody writes
    let weights: Vec<Weights> = parts.iter().map(|&(ty, n, _)| Weights::random(&mut rng, ty, n, k)).collect();
    let x = common::random_vec(&mut rng, m * k, 1.0);
    let bias = common::random_vec(&mut rng, parts[0].1, 10.0);
    let initial = common::random_vec(&mut rng, m * stride, 10.0);
    // Expected rows: each part's columns, the untouched ones keep their initial values.
    let mut want = initial.clone();
    let mut bound = vec![0f32; m * stride];
    let mut offset = 0;
    for (w, &(_, n, epilogue)) in weights.iter().zip(&parts) {
        let product = matmul(&x, m, &w.values, n, k);
        let dot_bound = dot_bounds(&matmul(&abs(&x), m, &w.abs(), n, k));
        for t in 0..m {
            for j in 0..n {
                let i = t * stride + offset + j;
                let add = if epilogue.bias {
                    bias[j]
                } else if epilogue.accumulate {
                    initial[i]
                } else {
                    0.0
                };
                want[i] = product[t * n + j] + add;
                bound[i] = dot_bound[t * n + j] + 3e-7 * (want[i].abs() + 10.0);
            }
        }
        offset += n;
    }
    for (device, gpu) in devices() {
        let step = StepUniform::new(&gpu);
        let x_t = Tensor::from_f32(&gpu, "x", &[m, k], &x).unwrap();
        let b_t = Tensor::from_f32(&gpu, "bias", &[bias.len()], &bias).unwrap();
        let y = Tensor::from_f32(&gpu, "y", &[m, stride], &initial).unwrap();
        let y_one = Tensor::from_f32(&gpu, "y", &[stride], &initial[..stride]).unwrap();
        let mut offset = 0;
        let (mut rec_matmul, mut rec_matvec) = (Recorder::new(&gpu), Recorder::new(&gpu));
        let mut keep = Vec::new();
        for (w, &(ty, n, epilogue)) in weights.iter().zip(&parts) {
            let out = OutputColumns { offset: offset as u32, stride: stride as u32 };
            let bias = epilogue.bias.then_some(&b_t);
            let weights = w.upload(&gpu);
            let mm = pollster::block_on(MatmulKernel::new(&gpu, ty, epilogue)).unwrap();
            let mm = mm.bind(&gpu, &Operands { w: &weights, x: &x_t, y: &y, out, bias }, &step, m as u32).unwrap();
            mm.record(&mut rec_matmul, &StepParams::new(m as u32, 0, 0));
            let mv = pollster::block_on(MatvecKernel::new(&gpu, ty, epilogue)).unwrap();
            let mv = mv.bind(&gpu, &Operands { w: &weights, x: &x_t, y: &y_one, out, bias }).unwrap();
            mv.record(&mut rec_matvec);
            keep.push((weights, mm, mv));
            offset += n;
        }
        step.write(&gpu, &StepParams::new(m as u32, 0, 0));
        rec_matmul.submit();
        rec_matvec.submit();
        let got = pollster::block_on(y.read_f32(&gpu)).unwrap();
        let got_one = pollster::block_on(y_one.read_f32(&gpu)).unwrap();
        assert_within(&format!("matmul into columns ({device})"), &got, &want, &bound);
        assert_within(&format!("matvec into columns ({device})"), &got_one, &want[..stride], &bound[..stride]);
        // Columns past the last part keep exactly their initial values.
        for t in 0..m {
            assert_eq!(got[t * stride + offset..(t + 1) * stride], initial[t * stride + offset..(t + 1) * stride], "token {t}");
        }
        // Columns that do not fit in the row are refused.
        let mv = pollster::block_on(MatvecKernel::new(&gpu, GgmlType::Q8_0, Epilogue::NONE)).unwrap();
        let err = mv.bind(
            &gpu,
            &Operands {
                w: &keep[1].0,
                x: &x_t,
                y: &y_one,
                out: OutputColumns { offset: stride as u32 - 4, stride: stride as u32 },
                bias: None,
            },
        );
        assert!(matches!(err, Err(GpuError::InvalidArgs(_))), "columns past the row accepted");
    }
}

/// Bound for act(g)·u given the bounds eg, eu on g and u: |act'| <= 1.13 (SiLU and GELU), plus
/// the rounding of exp, the division and the product (a few ε of the result).
fn gated_bound(act: GateActivation, g: f32, u: f32, eg: f32, eu: f32) -> f32 {
    let a = act.apply(g);
    GateActivation::MAX_SLOPE * eg * u.abs() + a.abs() * eu + eg * eu + 1e-6 * (a * u).abs()
}

/// The fused gate/up products with SiLU (SwiGLU) on every type, and with GELU (GeGLU) on a few.
#[test]
fn swiglu_matvec_and_matmul() {
    let mut rng = common::rng(8);
    let silu = [
        (GgmlType::Q4_1, 100, 576, 130),
        (GgmlType::Q8_0, 33, 544, 17),
        (GgmlType::F32, 7, 70, 3),
        (GgmlType::Q5_0, 100, 576, 130),
        (GgmlType::Q5_1, 33, 544, 17),
        (GgmlType::Q4_K, 100, 768, 130),
        (GgmlType::Q5_K, 33, 512, 17),
        (GgmlType::Q6_K, 100, 768, 33),
    ]
    .map(|c| (c, GateActivation::Silu));
    let gelu =
        [(GgmlType::Q8_0, 33, 544, 17), (GgmlType::Q4_K, 100, 768, 130), (GgmlType::F32, 7, 70, 3)].map(|c| (c, GateActivation::Gelu));
    for ((ty, n, k, m), act) in silu.into_iter().chain(gelu) {
        let gate = Weights::random(&mut rng, ty, n, k);
        let up = Weights::random(&mut rng, ty, n, k);
        let x = common::random_vec(&mut rng, m * k, 1.0);
        let want = gated(&x, m, &gate.values, &up.values, n, k, act);
        let g = matmul(&x, m, &gate.values, n, k);
        let u = matmul(&x, m, &up.values, n, k);
        let g_scale = matmul(&abs(&x), m, &gate.abs(), n, k);
        let u_scale = matmul(&abs(&x), m, &up.abs(), n, k);
        let (g_bound, u_bound) = (dot_bounds(&g_scale), dot_bounds(&u_scale));
        let bound: Vec<f32> = (0..m * n).map(|i| gated_bound(act, g[i], u[i], g_bound[i], u_bound[i])).collect();
        for (device, gpu) in devices() {
            let (gate_w, up_w) = (gate.upload(&gpu), up.upload(&gpu));
            let x_t = Tensor::from_f32(&gpu, "x", &[m, k], &x).unwrap();
            let what = format!("{act:?} {ty} M={m} {n}x{k} ({device})");

            let kernel = pollster::block_on(SwigluMatvecKernel::new(&gpu, ty, act)).unwrap();
            let out = Tensor::zeros(&gpu, "out", &[n], kestrel_gpu::DType::F32).unwrap();
            let dispatch = kernel.bind(&gpu, &GateUpOperands { gate: &gate_w, up: &up_w, x: &x_t, out: &out }).unwrap();
            assert_within(&format!("swiglu matvec {what}"), &run(&gpu, &dispatch, &out, n), &want[..n], &bound[..n]);

            let kernel = pollster::block_on(SwigluMatmulKernel::new(&gpu, ty, act)).unwrap();
            let step = StepUniform::new(&gpu);
            let out = Tensor::zeros(&gpu, "out", &[m, n], kestrel_gpu::DType::F32).unwrap();
            let dispatch = kernel.bind(&gpu, &GateUpOperands { gate: &gate_w, up: &up_w, x: &x_t, out: &out }, &step, m as u32).unwrap();
            assert_within(&format!("swiglu matmul {what}"), &run_matmul(&gpu, &step, &dispatch, &out, m), &want, &bound);
        }
    }
}

/// Gemma 2's LM head with its final soft cap: `cap * tanh(y / cap)` of each product. tanh's slope
/// is at most 1, so the product's bound holds, plus tanh's own few-ULP error of the result.
#[test]
fn soft_capped_matvec() {
    let mut rng = common::rng(12);
    let cap = 30.0f32;
    for ty in [GgmlType::Q8_0, GgmlType::F32] {
        let (n, k) = (300, 256);
        let w = Weights::random(&mut rng, ty, n, k);
        // Inputs of 8: products spread over +-60, well into the cap's bend.
        let x = common::random_vec(&mut rng, k, 8.0);
        let y = matmul(&x, 1, &w.values, n, k);
        let want: Vec<f32> = y.iter().map(|v| cap * (v / cap).tanh()).collect();
        assert!(y.iter().any(|v| v.abs() > cap), "no product reaches the cap");
        let bound: Vec<f32> = dot_bounds(&matmul(&abs(&x), 1, &w.abs(), n, k)).iter().zip(&want).map(|(b, v)| b + 1e-6 * v.abs()).collect();
        for (device, gpu) in devices() {
            let kernel = pollster::block_on(MatvecKernel::soft_capped(&gpu, ty, cap, 1)).unwrap();
            let x_t = Tensor::from_f32(&gpu, "x", &[k], &x).unwrap();
            let out = Tensor::zeros(&gpu, "out", &[n], kestrel_gpu::DType::F32).unwrap();
            let dispatch = kernel.bind(&gpu, &Operands::whole(&w.upload(&gpu), &x_t, &out, None)).unwrap();
            assert_within(&format!("soft-capped matvec {ty} ({device})"), &run(&gpu, &dispatch, &out, n), &want, &bound);
        }
    }
}

#[test]
fn bind_rejects_mismatched_shapes() {
    let gpu = common::gpu();
    let mut rng = common::rng(9);
    let (n, k) = (7, 64);
    let w = Weights::random(&mut rng, GgmlType::Q4_0, n, k).upload(&gpu);
    let other = Weights::random(&mut rng, GgmlType::Q4_0, n + 1, k).upload(&gpu);
    let q8 = Weights::random(&mut rng, GgmlType::Q8_0, n, k).upload(&gpu);
    let f32_zeros = |shape: &[usize]| Tensor::zeros(&gpu, "t", shape, kestrel_gpu::DType::F32).unwrap();
    let (x, y, bias) = (f32_zeros(&[k]), f32_zeros(&[n]), f32_zeros(&[n]));
    let (x_short, y_short, x_u32) =
        (f32_zeros(&[k - 1]), f32_zeros(&[n - 1]), Tensor::zeros(&gpu, "ids", &[k], kestrel_gpu::DType::U32).unwrap());
    let invalid = |r: Result<(), GpuError>, what: &str| {
        assert!(matches!(r, Err(GpuError::InvalidArgs(_))), "{what}: expected InvalidArgs, got {r:?}");
    };

    let mv = pollster::block_on(MatvecKernel::new(&gpu, GgmlType::Q4_0, Epilogue::NONE)).unwrap();
    assert!(mv.bind(&gpu, &Operands::whole(&w, &x, &y, None)).is_ok());
    invalid(mv.bind(&gpu, &Operands::whole(&q8, &x, &y, None)).map(drop), "weight type");
    invalid(mv.bind(&gpu, &Operands::whole(&w, &x_short, &y, None)).map(drop), "short x");
    invalid(mv.bind(&gpu, &Operands::whole(&w, &x, &y_short, None)).map(drop), "short y");
    invalid(mv.bind(&gpu, &Operands::whole(&w, &x_u32, &y, None)).map(drop), "u32 x");
    invalid(mv.bind(&gpu, &Operands::whole(&w, &y, &y, None)).map(drop), "x aliasing y");
    invalid(mv.bind(&gpu, &Operands::whole(&w, &x, &y, Some(&bias))).map(drop), "bias without BIAS");
    let mv_bias = pollster::block_on(MatvecKernel::new(&gpu, GgmlType::Q4_0, Epilogue::BIAS)).unwrap();
    invalid(mv_bias.bind(&gpu, &Operands::whole(&w, &x, &y, None)).map(drop), "missing bias");
    invalid(mv_bias.bind(&gpu, &Operands::whole(&w, &x, &y, Some(&y_short))).map(drop), "short bias");

    // Section offsets that do not fit the tensor (fields a caller could set by hand).
    let mv5 = pollster::block_on(MatvecKernel::new(&gpu, GgmlType::Q5_0, Epilogue::NONE)).unwrap();
    let mut w5 = Weights::random(&mut rng, GgmlType::Q5_0, n, k).upload(&gpu);
    assert!(mv5.bind(&gpu, &Operands::whole(&w5, &x, &y, None)).is_ok());
    w5.plane_offset -= 1;
    invalid(mv5.bind(&gpu, &Operands::whole(&w5, &x, &y, None)).map(drop), "plane section overlapping the quants");
    w5.plane_offset += 1;
    // Past the buffer, which is a whole number of 16-byte units: 4 words later.
    w5.scale_offset += 4;
    invalid(mv5.bind(&gpu, &Operands::whole(&w5, &x, &y, None)).map(drop), "scale section past the buffer");

    let sw = pollster::block_on(SwigluMatvecKernel::new(&gpu, GgmlType::Q4_0, GateActivation::Silu)).unwrap();
    assert!(sw.bind(&gpu, &GateUpOperands { gate: &w, up: &w, x: &x, out: &y }).is_ok());
    invalid(sw.bind(&gpu, &GateUpOperands { gate: &w, up: &other, x: &x, out: &y }).map(drop), "gate/up shapes");
    invalid(sw.bind(&gpu, &GateUpOperands { gate: &w, up: &q8, x: &x, out: &y }).map(drop), "gate/up types");

    let step = StepUniform::new(&gpu);
    let mm = pollster::block_on(MatmulKernel::new(&gpu, GgmlType::Q4_0, Epilogue::NONE)).unwrap();
    let (x4, y4) = (f32_zeros(&[4, k]), f32_zeros(&[4, n]));
    assert!(mm.bind(&gpu, &Operands::whole(&w, &x4, &y4, None), &step, 4).is_ok());
    invalid(mm.bind(&gpu, &Operands::whole(&w, &x4, &y4, None), &step, 5).map(drop), "x and y too small for max_tokens");
    invalid(mm.bind(&gpu, &Operands::whole(&w, &x4, &y, None), &step, 4).map(drop), "y too small for max_tokens");
    invalid(mm.bind(&gpu, &Operands::whole(&w, &x4, &y4, None), &step, 0).map(drop), "max_tokens 0");

    let swm = pollster::block_on(SwigluMatmulKernel::new(&gpu, GgmlType::Q4_0, GateActivation::Silu)).unwrap();
    invalid(swm.bind(&gpu, &GateUpOperands { gate: &w, up: &other, x: &x4, out: &y4 }, &step, 4).map(drop), "swiglu matmul gate/up shapes");

    assert!(matches!(pollster::block_on(MatvecKernel::new(&gpu, GgmlType::Q2_K, Epilogue::NONE)), Err(GpuError::UnsupportedWeights(_))));
}

/// The matvec over several tokens (a batch of sequences' decode step) on every type, into output
/// columns with every epilogue and into the fused gate/up: each token's outputs are bit for bit
/// what the one-token matvec gives it (a sequence gets the same tokens in a batch as alone), and
/// within the products' bound of the reference; rows past the last token stay untouched. Each
/// type takes one of the token counts and one device (pipelines are slow to build on lavapipe).
#[test]
fn batched_matvec_is_the_one_token_matvec_per_token() {
    let mut rng = common::rng(13);
    let types = [
        (GgmlType::F32, 33, 96),
        (GgmlType::F16, 33, 96),
        (GgmlType::Q8_0, 100, 544),
        (GgmlType::Q4_0, 33, 576),
        (GgmlType::Q4_1, 576, 576),
        (GgmlType::Q5_0, 7, 96),
        (GgmlType::Q5_1, 100, 544),
        (GgmlType::Q4_K, 100, 768),
        (GgmlType::Q5_K, 33, 512),
        (GgmlType::Q6_K, 1536, 256),
    ];
    let epilogues = [Epilogue::NONE, Epilogue::BIAS, Epilogue::ACCUMULATE];
    for (i, (ty, n, k)) in types.into_iter().enumerate() {
        let epilogue = epilogues[i % epilogues.len()];
        let w = Weights::random(&mut rng, ty, n, k);
        let up = Weights::random(&mut rng, ty, n, k);
        let bias = common::random_vec(&mut rng, n, 10.0);
        let columns = [2usize, 3, 8][i % 3];
        // Token rows of `stride` outputs starting at column 2, and one row more than the tokens.
        let (stride, offset) = (n + 5, 2);
        let out = OutputColumns { offset: offset as u32, stride: stride as u32 };
        let x = common::random_vec(&mut rng, columns * k, 1.0);
        let initial = common::random_vec(&mut rng, (columns + 1) * stride, 10.0);
        let want = matmul(&x, columns, &w.values, n, k);
        let bound = dot_bounds(&matmul(&abs(&x), columns, &w.abs(), n, k));
        let (device, gpu) = devices().into_iter().nth(i % 2).unwrap();
        let what = format!("matvec {ty} {n}x{k} {columns} tokens {epilogue:?} ({device})");
        let (weights, up_weights) = (w.upload(&gpu), up.upload(&gpu));
        let b_t = Tensor::from_f32(&gpu, "bias", &[n], &bias).unwrap();
        let x_t = Tensor::from_f32(&gpu, "x", &[columns, k], &x).unwrap();
        let bias_of = epilogue.bias.then_some(&b_t);
        let batched = pollster::block_on(MatvecKernel::batched(&gpu, ty, epilogue, columns as u32)).unwrap();
        let y = Tensor::from_f32(&gpu, "y", &[columns + 1, stride], &initial).unwrap();
        let got = run(
            &gpu,
            &batched.bind(&gpu, &Operands { w: &weights, x: &x_t, y: &y, out, bias: bias_of }).unwrap(),
            &y,
            (columns + 1) * stride,
        );
        let single = pollster::block_on(MatvecKernel::new(&gpu, ty, epilogue)).unwrap();
        for t in 0..columns {
            let x_one = Tensor::from_f32(&gpu, "x", &[k], &x[t * k..][..k]).unwrap();
            let y_one = Tensor::from_f32(&gpu, "y", &[stride], &initial[t * stride..][..stride]).unwrap();
            let alone =
                run(&gpu, &single.bind(&gpu, &Operands { w: &weights, x: &x_one, y: &y_one, out, bias: bias_of }).unwrap(), &y_one, stride);
            let row = &got[t * stride..][..stride];
            assert!(row.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: token {t} differs from alone");
            let add = |j: usize| match epilogue {
                e if e.bias => bias[j],
                e if e.accumulate => initial[t * stride + offset + j],
                _ => 0.0,
            };
            let want_t: Vec<f32> = (0..n).map(|j| want[t * n + j] + add(j)).collect();
            let bound_t: Vec<f32> = (0..n).map(|j| bound[t * n + j] + 3e-7 * (want_t[j].abs() + 10.0)).collect();
            assert_within(&format!("{what}: token {t}"), &row[offset..][..n], &want_t, &bound_t);
            assert_eq!(row[..offset], initial[t * stride..][..offset], "{what}: columns before the offset");
        }
        assert_eq!(got[columns * stride..], initial[columns * stride..], "{what}: wrote past the last token");

        let swiglu = pollster::block_on(SwigluMatvecKernel::batched(&gpu, ty, GateActivation::Silu, columns as u32)).unwrap();
        let ffn = Tensor::zeros(&gpu, "ffn", &[columns, n], kestrel_gpu::DType::F32).unwrap();
        let got = run(
            &gpu,
            &swiglu.bind(&gpu, &GateUpOperands { gate: &weights, up: &up_weights, x: &x_t, out: &ffn }).unwrap(),
            &ffn,
            columns * n,
        );
        let single = pollster::block_on(SwigluMatvecKernel::new(&gpu, ty, GateActivation::Silu)).unwrap();
        for t in 0..columns {
            let x_one = Tensor::from_f32(&gpu, "x", &[k], &x[t * k..][..k]).unwrap();
            let ffn_one = Tensor::zeros(&gpu, "ffn", &[n], kestrel_gpu::DType::F32).unwrap();
            let alone = run(
                &gpu,
                &single.bind(&gpu, &GateUpOperands { gate: &weights, up: &up_weights, x: &x_one, out: &ffn_one }).unwrap(),
                &ffn_one,
                n,
            );
            let same = got[t * n..][..n].iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "swiglu {what}: token {t} differs from alone");
        }
    }
    // Several tokens need rows of whole vec4s.
    let gpu = common::gpu();
    let w = Weights::random(&mut rng, GgmlType::F32, 5, 38).upload(&gpu);
    let x = Tensor::zeros(&gpu, "x", &[2, 38], kestrel_gpu::DType::F32).unwrap();
    let y = Tensor::zeros(&gpu, "y", &[2, 5], kestrel_gpu::DType::F32).unwrap();
    let kernel = pollster::block_on(MatvecKernel::batched(&gpu, GgmlType::F32, Epilogue::NONE, 2)).unwrap();
    assert!(matches!(kernel.bind(&gpu, &Operands::whole(&w, &x, &y, None)), Err(GpuError::InvalidArgs(_))));
    // x too short for the tokens.
    let w = Weights::random(&mut rng, GgmlType::Q8_0, 5, 64).upload(&gpu);
    let x = Tensor::zeros(&gpu, "x", &[1, 64], kestrel_gpu::DType::F32).unwrap();
    let kernel = pollster::block_on(MatvecKernel::batched(&gpu, GgmlType::Q8_0, Epilogue::NONE, 2)).unwrap();
    assert!(matches!(kernel.bind(&gpu, &Operands::whole(&w, &x, &y, None)), Err(GpuError::InvalidArgs(_))));
    assert!(matches!(pollster::block_on(MatvecKernel::batched(&gpu, GgmlType::Q8_0, Epilogue::NONE, 17)), Err(GpuError::InvalidArgs(_))));
}

/// A token's prefill products do not depend on the chunk it runs in: a tile of at most 8 tokens
/// (the batched-matvec path), a tile whose threads have 1, 2-4 or 8 of their tokens, and a full
/// tile give it the same bits, plain and fused gate/up, on both devices (the model relies on it:
/// a prompt whose prefix was cached gets the same tokens as cold).
#[test]
fn matmul_token_products_do_not_depend_on_the_chunk() {
    let mut rng = common::rng(14);
    // (first token, tokens) of chunks cut from a 70-token prompt.
    let chunks = [(0, 1), (5, 3), (64, 6), (10, 8), (3, 9), (20, 17), (30, 40), (0, 64)];
    for (i, (ty, n, k)) in [(GgmlType::Q4_1, 70, 576), (GgmlType::Q4_K, 33, 512), (GgmlType::F32, 9, 70)].into_iter().enumerate() {
        let w = Weights::random(&mut rng, ty, n, k);
        let up = Weights::random(&mut rng, ty, n, k);
        let m = 70;
        let x = common::random_vec(&mut rng, m * k, 1.0);
        let (device, gpu) = devices().into_iter().nth(i % 2).unwrap();
        let (weights, up_weights) = (w.upload(&gpu), up.upload(&gpu));
        let plain = pollster::block_on(MatmulKernel::new(&gpu, ty, Epilogue::NONE)).unwrap();
        let fused = pollster::block_on(SwigluMatmulKernel::new(&gpu, ty, GateActivation::Silu)).unwrap();
        let step = StepUniform::new(&gpu);
        // The products of tokens first..first + count run as one chunk: (plain, fused).
        let products = |first: usize, count: usize| {
            let x_t = Tensor::from_f32(&gpu, "x", &[count, k], &x[first * k..][..count * k]).unwrap();
            let y = Tensor::zeros(&gpu, "y", &[count, n], kestrel_gpu::DType::F32).unwrap();
            let dispatch = plain.bind(&gpu, &Operands::whole(&weights, &x_t, &y, None), &step, count as u32).unwrap();
            let y = run_matmul(&gpu, &step, &dispatch, &y, count);
            let ffn = Tensor::zeros(&gpu, "ffn", &[count, n], kestrel_gpu::DType::F32).unwrap();
            let dispatch =
                fused.bind(&gpu, &GateUpOperands { gate: &weights, up: &up_weights, x: &x_t, out: &ffn }, &step, count as u32).unwrap();
            (y, run_matmul(&gpu, &step, &dispatch, &ffn, count))
        };
        let (whole, whole_ffn) = products(0, m);
        let bound = dot_bounds(&matmul(&abs(&x), m, &w.abs(), n, k));
        assert_within(&format!("matmul {ty} M={m} ({device})"), &whole, &matmul(&x, m, &w.values, n, k), &bound);
        for (first, count) in chunks {
            let (y, ffn) = products(first, count);
            let what = format!("{ty} {n}x{k} tokens {first}..{} ({device})", first + count);
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&y, &whole[first * n..][..count * n]), "matmul {what}: differs from the 70-token chunk");
            assert!(same(&ffn, &whole_ffn[first * n..][..count * n]), "swiglu matmul {what}: differs from the 70-token chunk");
        }
    }
}
