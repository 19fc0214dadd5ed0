//! RoPE on the GPU against `reference::rope::rope`, including the KV cache it writes.

mod common;

use kestrel_gpu::kernels::attention::KvCache;
use kestrel_gpu::kernels::rope::{RopeKernel, RopeOperands};
use kestrel_gpu::{DType, Gpu, GpuError, Recorder, StepOp, StepParams, StepRows, StepUniform, Tensor};
use kestrel_ops::params::{AttentionShape, KvType, RopeConfig, RopeMode, YarnRamp};
use kestrel_ops::reference::rope::rope;
use rand::Rng;

// The shader's angle is exact to ~2e-7 rad (fixed-point turns, reduced to [-pi, pi) before
// sin/cos) and each output is x0*cos -/+ x1*sin with |x| < 1: a few f32 roundings plus
// sin/cos error. Lavapipe's sin/cos are libm-accurate; WGSL only promises 2^-11 absolute on
// [-pi, pi], so a driver with approximate transcendentals would need a looser bound.
const ATOL: f32 = 1e-6;
/// An f16 cache holds one of the two f16 values nearest the f32 result (WGSL leaves the choice to
/// the implementation): within one f16 step, 2^-10 of the value (normal range; below it the step
/// is 2^-24, inside ATOL).
const F16_RTOL: f32 = 1.0 / 1024.0;

const MAX_CTX: usize = 2048;
const MAX_TOKENS: usize = 16;
/// Sequences in the cache: a step's tokens may go to any of them.
const SLOTS: usize = 2;

fn llama3_factors(head_dim: usize) -> Vec<f32> {
    // Shaped like Llama 3.1's rope_freqs: 1 for high frequencies, up to 8 for low ones.
    (0..head_dim / 2).map(|i| 1.0 + 7.0 * (i as f32 / (head_dim / 2 - 1) as f32).powi(2)).collect()
}

/// Runs steps of tokens at (slot, position) through RoPE and checks each step's Q and, at the
/// end, the whole cache of every slot (never-written positions must still be zero). No config: a
/// layer without RoPE, whose Q and K are copied unrotated.
fn check(
    gpu: &Gpu,
    kernel: &RopeKernel,
    kv: KvType,
    shape: AttentionShape,
    config: Option<&RopeConfig>,
    steps: &[Vec<[u32; 2]>],
    seed: u64,
) {
    let rope = |x: &[f32], hd: usize, p: usize| config.map_or_else(|| x.to_vec(), |c| rope(x, hd, p, c));
    let mut rng = common::rng(seed);
    let hd = shape.head_dim;
    let (q_width, kv_width) = (shape.q_width(), shape.n_kv_heads * hd);
    let qkv_width = q_width + 2 * kv_width;
    let qkv = Tensor::zeros(gpu, "qkv", &[MAX_TOKENS, qkv_width], DType::F32).unwrap();
    let q_out = Tensor::zeros(gpu, "q", &[MAX_TOKENS, q_width], DType::F32).unwrap();
    let cache = KvCache::new(gpu, "cache", shape, kv, SLOTS).unwrap();
    let step = StepUniform::new(gpu);
    let step_rows = StepRows::new(gpu, MAX_TOKENS).unwrap();
    let dispatch = kernel.bind(gpu, &step, &step_rows, &RopeOperands { config, qkv: &qkv, q_out: &q_out, cache: &cache }).unwrap();
    let mut want_k = vec![0f32; SLOTS * shape.cache_len()];
    let mut want_v = vec![0f32; SLOTS * shape.cache_len()];
    let what = format!("rope {config:?} hd={hd} {} cache subgroups={}", kv.name(), gpu.features.subgroups);
    for tokens in steps {
        let n_tokens = tokens.len();
        let rows = common::random_vec(&mut rng, n_tokens * qkv_width, 1.0);
        gpu.write(&qkv.buffer, 0, bytemuck::cast_slice(&rows));
        // The uniform's position is not RoPE's: each token's comes from the step rows.
        let params = StepParams::new(n_tokens as u32, 0, 0);
        step.write(gpu, &params);
        step_rows.write(gpu, tokens).unwrap();
        let mut rec = Recorder::new(gpu);
        dispatch.record(&mut rec, &params);
        rec.submit();
        let got_q = pollster::block_on(q_out.read_f32(gpu)).unwrap();
        for (t, row) in rows.chunks_exact(qkv_width).enumerate() {
            let [slot, p] = tokens[t].map(|v| v as usize);
            let want_q = rope(&row[..q_width], hd, p);
            common::assert_close(&format!("{what} q pos {p}"), &got_q[t * q_width..][..q_width], &want_q, 0.0, ATOL);
            let k = rope(&row[q_width..][..kv_width], hd, p);
            let v = &row[q_width + kv_width..];
            for h in 0..shape.n_kv_heads {
                let at = ((slot * shape.n_kv_heads + h) * shape.max_ctx + p) * hd;
                want_k[at..at + hd].copy_from_slice(&k[h * hd..][..hd]);
                want_v[at..at + hd].copy_from_slice(&v[h * hd..][..hd]);
            }
        }
    }
    let got_k = kv.decode(&pollster::block_on(cache.k.read_bytes(gpu)).unwrap());
    let got_v = kv.decode(&pollster::block_on(cache.v.read_bytes(gpu)).unwrap());
    match kv {
        KvType::F32 => {
            common::assert_close(&format!("{what} k cache"), &got_k, &want_k, 0.0, ATOL);
            assert_eq!(got_v, want_v, "{what}: v cache must be an exact copy");
        }
        KvType::F16 => {
            common::assert_close(&format!("{what} k cache"), &got_k, &want_k, F16_RTOL, ATOL);
            common::assert_close(&format!("{what} v cache"), &got_v, &want_v, F16_RTOL, 0.0);
        }
    }
}

#[test]
fn rope_matches_reference_and_fills_cache() {
    let small = AttentionShape { n_heads: 9, n_kv_heads: 3, head_dim: 64, max_ctx: MAX_CTX };
    let big = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 128, max_ctx: MAX_CTX };
    let configs = [
        (small, RopeConfig::new(RopeMode::Norm, 10_000.0)),
        (small, RopeConfig::new(RopeMode::Neox, 100_000.0)),
        (big, RopeConfig::new(RopeMode::Neox, 10_000.0)),
        (big, RopeConfig { freq_scale: 0.25, freq_factors: Some(llama3_factors(128)), ..RopeConfig::new(RopeMode::Norm, 500_000.0) }),
        (small, RopeConfig { freq_factors: Some(llama3_factors(64)), ..RopeConfig::new(RopeMode::Neox, 100_000.0) }),
        // Phi-3's attention factor with its long factors; YaRN with factor 4 from 4096 positions.
        (small, RopeConfig { freq_factors: Some(llama3_factors(64)), mscale: 1.19, ..RopeConfig::new(RopeMode::Neox, 10_000.0) }),
        (
            big,
            RopeConfig {
                freq_scale: 0.25,
                yarn: Some(YarnRamp::new(128, 4096, 1e6, 32.0, 1.0)),
                mscale: 1.0 + 0.1 * 4f32.ln(),
                ..RopeConfig::new(RopeMode::Neox, 1e6)
            },
        ),
    ];
    let configs: Vec<(AttentionShape, Option<RopeConfig>)> =
        configs.into_iter().map(|(shape, c)| (shape, Some(c))).chain([(small, None)]).collect();
    for gpu in [common::gpu(), common::gpu_without_subgroups()] {
        for kv in [KvType::F16, KvType::F32] {
            let kernel = pollster::block_on(RopeKernel::new(&gpu, kv)).unwrap();
            for (i, (shape, config)) in configs.iter().enumerate() {
                // A prefill chunk from 0 in slot 0, single tokens and short chunks at sampled
                // positions up to the last one, 2047, in either slot, and batched steps whose
                // tokens are in different slots at unrelated positions.
                let mut rng = common::rng(100 + i as u64);
                let run = |slot: u32, pos: usize, n: usize| (pos..pos + n).map(|p| [slot, p as u32]).collect::<Vec<_>>();
                let last = MAX_CTX as u32 - 1;
                let mut steps = vec![run(0, 0, MAX_TOKENS), run(1, MAX_CTX - 1, 1), run(0, MAX_CTX - 4, 3)];
                steps.push(vec![[1, 5], [0, 700], [1, last - 1]]);
                for _ in 0..4 {
                    let (slot, n) = (rng.random_range(0..SLOTS as u32), rng.random_range(1..=MAX_TOKENS));
                    steps.push(run(slot, rng.random_range(MAX_TOKENS..MAX_CTX - 2 * MAX_TOKENS), n));
                }
                check(&gpu, &kernel, kv, *shape, config.as_ref(), &steps, i as u64);
            }
        }
    }
}

#[test]
fn rope_rejects_bad_config() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(RopeKernel::new(&gpu, KvType::F16)).unwrap();
    let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 8, max_ctx: 4 };
    let qkv = Tensor::zeros(&gpu, "qkv", &[2, 32], DType::F32).unwrap();
    let q = Tensor::zeros(&gpu, "q", &[2, 16], DType::F32).unwrap();
    let cache = KvCache::new(&gpu, "cache", shape, KvType::F16, 1).unwrap();
    let step = StepUniform::new(&gpu);
    let rows = StepRows::new(&gpu, 2).unwrap();
    let f32_cache = KvCache::new(&gpu, "cache", shape, KvType::F32, 1).unwrap();
    let good = RopeConfig::new(RopeMode::Norm, 10_000.0);
    assert!(
        matches!(
            kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&good), qkv: &qkv, q_out: &q, cache: &f32_cache }),
            Err(GpuError::InvalidArgs(_))
        ),
        "cache type"
    );
    let bad_factors = RopeConfig { freq_factors: Some(vec![1.0; 3]), ..RopeConfig::new(RopeMode::Norm, 10_000.0) };
    assert!(matches!(
        kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&bad_factors), qkv: &qkv, q_out: &q, cache: &cache }),
        Err(GpuError::InvalidArgs(_))
    ));
    let bad_base = RopeConfig::new(RopeMode::Norm, 0.0);
    assert!(matches!(
        kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&bad_base), qkv: &qkv, q_out: &q, cache: &cache }),
        Err(GpuError::InvalidArgs(_))
    ));
    let q_wrong = Tensor::zeros(&gpu, "q", &[3, 16], DType::F32).unwrap();
    assert!(matches!(
        kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&good), qkv: &qkv, q_out: &q_wrong, cache: &cache }),
        Err(GpuError::InvalidArgs(_))
    ));
    let bad_mscale = RopeConfig { mscale: f32::NAN, ..RopeConfig::new(RopeMode::Norm, 10_000.0) };
    assert!(matches!(
        kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&bad_mscale), qkv: &qkv, q_out: &q, cache: &cache }),
        Err(GpuError::InvalidArgs(_))
    ));
    assert!(kernel.bind(&gpu, &step, &rows, &RopeOperands { config: Some(&good), qkv: &qkv, q_out: &q, cache: &cache }).is_ok());
    assert!(kernel.bind(&gpu, &step, &rows, &RopeOperands { config: None, qkv: &qkv, q_out: &q, cache: &cache }).is_ok());
    let short_rows = StepRows::new(&gpu, 1).unwrap();
    assert!(
        matches!(
            kernel.bind(&gpu, &step, &short_rows, &RopeOperands { config: None, qkv: &qkv, q_out: &q, cache: &cache }),
            Err(GpuError::InvalidArgs(_))
        ),
        "step rows"
    );
}
