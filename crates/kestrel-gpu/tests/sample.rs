//! GPU sampling and logit processing against `reference::sample`.
mod common;

use kestrel_gpu::kernels::sample::{PenaltyKernel, SampleKernel, TokenMaskKernel};
use kestrel_gpu::{DType, Gpu, Readback, Recorder, StepOp, StepParams, StepUniform, Tensor};
use kestrel_ops::params::{Penalties, PenaltyEntry, SamplingParams};
use kestrel_ops::reference::sample as reference;
use rand::Rng;

fn devices() -> [Gpu; 2] {
    [common::gpu(), common::gpu_without_subgroups()]
}

/// Samples `logits` once per step seed, each draw with its own binding and step uniform so that
/// all of them run in one submit. Returns (token, probability) per seed.
fn draws(gpu: &Gpu, kernel: &SampleKernel, logits: &Tensor, params: &SamplingParams, seeds: &[u32]) -> Vec<(u32, f32)> {
    let readback = Readback::new(gpu, 8 * seeds.len() as u64);
    let mut rec = Recorder::new(gpu);
    // Kept alive until the submit.
    let mut bound = Vec::new();
    for (j, &seed) in seeds.iter().enumerate() {
        let step = StepUniform::new(gpu);
        let step_params = StepParams::new(1, 0, seed);
        step.write(gpu, &step_params);
        let out = Tensor::zeros(gpu, "out", &[2], DType::U32).unwrap();
        let binding = kernel.bind(gpu, logits, &step, &out).unwrap();
        binding.set_params(gpu, params).unwrap();
        binding.record(&mut rec, &step_params);
        rec.copy(&out.buffer, 0, readback.buffer(), 8 * j as u64, 8);
        bound.push((step, out, binding));
    }
    rec.submit();
    let words = pollster::block_on(readback.read_u32(gpu, 8 * seeds.len() as u64)).unwrap();
    words.chunks(2).map(|w| (w[0], f32::from_bits(w[1]))).collect()
}

fn draw_one(gpu: &Gpu, kernel: &SampleKernel, logits: &[f32], params: &SamplingParams, seed: u32) -> (u32, f32) {
    let logits = Tensor::from_f32(gpu, "logits", &[logits.len()], logits).unwrap();
    draws(gpu, kernel, &logits, params, &[seed])[0]
}

/// Softmax probability of `logits[i]` at temperature 1, in f64.
fn softmax_prob(logits: &[f32], i: usize) -> f64 {
    let max = logits[reference::argmax(logits)] as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    (logits[i] as f64 - max).exp() / z
}

#[test]
fn argmax_is_exact_with_ties() {
    for gpu in devices() {
        let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        let mut rng = common::rng(1);
        for n in [1usize, 7, 1000, 49152, 128256] {
            let mut logits = common::random_vec(&mut rng, n, 8.0);
            // A tie for the maximum: the lower index must win, wherever the two sit.
            if n > 2 {
                let (a, b) = (rng.random_range(0..n / 2), rng.random_range(n / 2..n));
                logits[b] = 9.0;
                logits[a] = 9.0;
            }
            let want = reference::argmax(&logits);
            let (token, prob) = draw_one(&gpu, &kernel, &logits, &SamplingParams::greedy(), 0);
            assert_eq!(token as usize, want, "argmax over {n}");
            // Probability: 1 / sum(exp(l - max)), f32 sums of up to 128K terms and the GPU's exp
            // (a few ulp): 1e-5 relative is ~100x their error, far below any wrong-index error.
            let p = softmax_prob(&logits, want);
            assert!(((prob as f64) - p).abs() <= 1e-5 * p, "argmax prob over {n}: {prob} vs {p}");
        }
        // All equal (also all banned): the first index.
        for value in [0.5, f32::NEG_INFINITY] {
            let flat = vec![value; 3000];
            assert_eq!(draw_one(&gpu, &kernel, &flat, &SamplingParams::greedy(), 0).0, 0, "all {value}");
        }
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    for gpu in devices() {
        let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        let logits = common::random_vec(&mut common::rng(2), 1000, 1.0);
        let logits = Tensor::from_f32(&gpu, "logits", &[1000], &logits).unwrap();
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 42 };
        let seeds: Vec<u32> = (0..8).collect();
        let first = draws(&gpu, &kernel, &logits, &params, &seeds);
        let again = draws(&gpu, &kernel, &logits, &params, &seeds);
        assert_eq!(first, again, "same seeds, same tokens");
        // A flat distribution over 1000 tokens: 8 equal draws would be a broken RNG.
        let distinct: std::collections::BTreeSet<u32> = first.iter().map(|d| d.0).collect();
        assert!(distinct.len() >= 4, "different step seeds gave {first:?}");
        let other = draws(&gpu, &kernel, &logits, &SamplingParams { seed: 43, ..params }, &seeds);
        assert_ne!(first, other, "a different request seed changes the draws");
    }
}

/// Draws `n_draws` times and checks: every token in the reference's allowed set; each draw equal to
/// the CPU sampler's whenever u is not within rounding of a cumulative boundary; frequencies
/// close to the reference probabilities (Pearson chi-square).
fn check_distribution(gpu: &Gpu, kernel: &SampleKernel, logits: &[f32], params: &SamplingParams, n_draws: u32) {
    let tensor = Tensor::from_f32(gpu, "logits", &[logits.len()], logits).unwrap();
    let seeds: Vec<u32> = (0..n_draws).map(|s| s.wrapping_mul(2_654_435_761)).collect();
    let got = draws(gpu, kernel, &tensor, params, &seeds);
    let (ids, probs) = reference::distribution(logits, params);
    let mut counts = vec![0u32; ids.len()];
    let mut compared = 0;
    for (&seed, &(token, prob)) in seeds.iter().zip(&got) {
        let slot = ids.binary_search(&token).unwrap_or_else(|_| panic!("{params:?}: token {token} not allowed ({ids:?})"));
        counts[slot] += 1;
        // The chosen token's probability: same f32 arithmetic in a different order.
        assert!((prob - probs[slot]).abs() <= 1e-4 * probs[slot] + 1e-7, "{params:?}: prob {prob} vs {}", probs[slot]);
        let u = reference::random_unit(params.seed, seed);
        let mut cum = 0.0f32;
        let margin = probs
            .iter()
            .map(|p| {
                cum += p;
                (cum - u).abs()
            })
            .fold(f32::INFINITY, f32::min);
        if margin > 1e-4 {
            assert_eq!(token, reference::sample(logits, params, seed), "{params:?}: seed {seed}, u {u}");
            compared += 1;
        }
    }
    assert!(compared > n_draws * 9 / 10, "{params:?}: only {compared} draws far from a boundary");
    // Chi-square over tokens expected >= 5 times, the rest pooled. Its mean is the degrees of
    // freedom; mean + 5 standard deviations + 10 is a loose bound a correct sampler fails with
    // negligible probability, while sampling uniformly from the set, or ignoring a filter, lands
    // far above it for these peaked distributions.
    let expected: Vec<f64> = probs.iter().map(|&p| p as f64 * n_draws as f64).collect();
    let (mut chi2, mut pooled_e, mut pooled_o, mut cells) = (0.0, 0.0, 0.0, 0);
    for (&e, &o) in expected.iter().zip(&counts) {
        if e >= 5.0 {
            chi2 += (o as f64 - e).powi(2) / e;
            cells += 1;
        } else {
            pooled_e += e;
            pooled_o += o as f64;
        }
    }
    if pooled_e > 0.0 {
        chi2 += (pooled_o - pooled_e).powi(2) / pooled_e.max(1.0);
        cells += 1;
    }
    let df = (cells as f64 - 1.0).max(1.0);
    let bound = df + 5.0 * (2.0 * df).sqrt() + 10.0;
    assert!(chi2 <= bound, "{params:?}: chi-square {chi2:.1} > {bound:.1} (counts {counts:?}, expected {expected:?})");
    let top = argmax_u32(&counts);
    let want_top = argmax_f32(&probs);
    if probs[want_top] > 2.0 * probs.iter().enumerate().filter(|(i, _)| *i != want_top).map(|(_, &p)| p).fold(0.0, f32::max) {
        assert_eq!(top, want_top, "{params:?}: most frequent token");
    }
}

fn argmax_u32(v: &[u32]) -> usize {
    (0..v.len()).max_by_key(|&i| (v[i], std::cmp::Reverse(i))).unwrap()
}

fn argmax_f32(v: &[f32]) -> usize {
    reference::argmax(v)
}

/// Logits with a few dominant tokens over a long tail, like a language model's.
fn peaked_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = common::rng(seed);
    let mut logits = common::random_vec(&mut rng, n, 2.0);
    for (rank, i) in (0..6).map(|_| rng.random_range(0..n)).enumerate() {
        logits[i] = 9.0 - rank as f32 * 0.7;
    }
    logits
}

#[test]
fn filters_keep_to_the_allowed_set_and_its_probabilities() {
    let configs = [
        SamplingParams { temperature: 1.0, top_k: 5, top_p: 1.0, min_p: 0.0, seed: 1 },
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.6, min_p: 0.0, seed: 2 },
        SamplingParams { temperature: 1.3, top_k: 0, top_p: 1.0, min_p: 0.1, seed: 3 },
        SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 4 },
        SamplingParams { temperature: 1.0, top_k: 3, top_p: 0.2, min_p: 0.0, seed: 5 },
    ];
    for gpu in devices() {
        let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        for (j, params) in configs.iter().enumerate() {
            check_distribution(&gpu, &kernel, &peaked_logits(10 + j as u64, 1000), params, 200);
        }
        // The default model's vocabulary; fewer draws, as a single-workgroup search over 49152
        // logits is slow on lavapipe.
        check_distribution(&gpu, &kernel, &peaked_logits(20, 49152), &configs[3], 50);
        // No filter at all, over a flat distribution: the whole vocabulary is allowed.
        let flat = common::random_vec(&mut common::rng(21), 7, 0.5);
        check_distribution(&gpu, &kernel, &flat, &SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 6 }, 200);
    }
}

#[test]
fn ties_at_the_top_k_threshold_are_all_kept() {
    let mut logits = vec![-5.0f32; 100];
    for i in [3, 17, 42, 80] {
        logits[i] = 1.0;
    }
    logits[60] = 2.0;
    let params = SamplingParams { temperature: 1.0, top_k: 2, top_p: 1.0, min_p: 0.0, seed: 0 };
    assert_eq!(reference::allowed_tokens(&logits, &params), vec![3, 17, 42, 60, 80]);
    for gpu in devices() {
        let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        check_distribution(&gpu, &kernel, &logits, &params, 200);
    }
}

#[test]
fn tiny_temperature_behaves_as_argmax() {
    for gpu in devices() {
        let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        let mut logits = common::random_vec(&mut common::rng(3), 5000, 4.0);
        let best = reference::argmax(&logits);
        logits[best] += 0.5;
        let tensor = Tensor::from_f32(&gpu, "logits", &[5000], &logits).unwrap();
        let params = SamplingParams { temperature: 1e-3, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 9 };
        for (token, prob) in draws(&gpu, &kernel, &tensor, &params, &[1, 2, 3, 4, 5]) {
            assert_eq!((token as usize, prob), (best, 1.0));
        }
    }
}

/// Reads the logits after the penalty kernel ran on `logits` (with 16 guard values past the
/// vocabulary that must stay untouched).
fn penalized(gpu: &Gpu, logits: &[f32], entries: &[PenaltyEntry], penalties: &Penalties) -> Vec<f32> {
    let kernel = pollster::block_on(PenaltyKernel::new(gpu)).unwrap();
    let guard = [7.25f32; 16];
    let padded: Vec<f32> = logits.iter().chain(&guard).copied().collect();
    let mut tensor = Tensor::from_f32(gpu, "logits", &[padded.len()], &padded).unwrap();
    tensor.shape = vec![logits.len()];
    let binding = kernel.bind(gpu, &tensor, entries.len() as u32).unwrap();
    binding.write(gpu, penalties, entries).unwrap();
    let mut rec = Recorder::new(gpu);
    binding.record(&mut rec, &StepParams::new(1, 0, 0));
    rec.submit();
    tensor.shape = vec![padded.len()];
    let out = pollster::block_on(tensor.read_f32(gpu)).unwrap();
    assert_eq!(&out[logits.len()..], &guard, "values past the vocabulary were written");
    out[..logits.len()].to_vec()
}

#[test]
fn penalties_and_bias_match_reference() {
    for gpu in devices() {
        for (n, seed) in [(1000usize, 4u64), (49152, 5)] {
            let mut rng = common::rng(seed);
            let mut logits = common::random_vec(&mut rng, n, 6.0);
            logits[0] = 0.0;
            // Distinct ids with counts 0 to 3 and biases (0: a penalty only; counted, biased,
            // banned), two past the vocabulary.
            let mut entries: Vec<PenaltyEntry> = (0..40u32)
                .map(|token| {
                    let bias = if rng.random_range(0..3) == 0 { 0.0 } else { rng.random_range(-2.0..2.0) };
                    PenaltyEntry::new(token, rng.random_range(0..4), bias)
                })
                .collect();
            entries[7] = PenaltyEntry::new(7, 2, f32::NEG_INFINITY);
            entries.extend([PenaltyEntry::new(600, 0, 0.75), PenaltyEntry::new(n as u32 + 3, 1, 4.0), PenaltyEntry::new(u32::MAX, 2, 1.0)]);
            for penalties in [
                Penalties { repeat: 1.3, frequency: 0.2, presence: 0.5 },
                Penalties { repeat: 0.8, frequency: 0.0, presence: 0.0 },
                Penalties::default(),
            ] {
                let got = penalized(&gpu, &logits, &entries, &penalties);
                let want = reference::apply_penalties(&logits, &entries, &penalties);
                // Exact arithmetic on both sides; 1 ulp for a GPU compiler fusing
                // count * frequency + presence into one fma.
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let ulps = (g.to_bits() as i64 - w.to_bits() as i64).abs();
                    assert!(g == w || ulps <= 1, "{penalties:?} vocab {n} token {i}: got {g}, want {w}");
                }
                assert_eq!(got[7], f32::NEG_INFINITY);
            }
        }
    }
}

#[test]
fn banned_token_is_never_chosen() {
    for gpu in devices() {
        let sampler = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        let penalty = pollster::block_on(PenaltyKernel::new(&gpu)).unwrap();
        let logits = peaked_logits(6, 2000);
        let banned = reference::argmax(&logits) as u32;
        let tensor = Tensor::from_f32(&gpu, "logits", &[2000], &logits).unwrap();
        let entries = [PenaltyEntry::new(banned, 0, f32::NEG_INFINITY)];
        let processing = penalty.bind(&gpu, &tensor, 4).unwrap();
        processing.write(&gpu, &Penalties::default(), &entries).unwrap();
        let mut rec = Recorder::new(&gpu);
        processing.record(&mut rec, &StepParams::new(1, 0, 0));
        rec.submit();
        let expect_greedy = reference::argmax(&reference::apply_penalties(&logits, &entries, &Penalties::default()));
        assert_eq!(draws(&gpu, &sampler, &tensor, &SamplingParams::greedy(), &[0])[0].0 as usize, expect_greedy);
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 7 };
        let seeds: Vec<u32> = (0..100).collect();
        for (token, _) in draws(&gpu, &sampler, &tensor, &params, &seeds) {
            assert_ne!(token, banned);
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let gpu = common::gpu();
    let kernel = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
    let logits = Tensor::zeros(&gpu, "logits", &[10], DType::F32).unwrap();
    let step = StepUniform::new(&gpu);
    let small = Tensor::zeros(&gpu, "out", &[1], DType::U32).unwrap();
    assert!(kernel.bind(&gpu, &logits, &step, &small).is_err());
    let out = Tensor::zeros(&gpu, "out", &[2], DType::U32).unwrap();
    let binding = kernel.bind(&gpu, &logits, &step, &out).unwrap();
    for bad in [
        SamplingParams { top_p: 1.5, ..Default::default() },
        SamplingParams { min_p: -0.1, ..Default::default() },
        SamplingParams { temperature: f32::NAN, ..Default::default() },
    ] {
        assert!(binding.set_params(&gpu, &bad).is_err(), "{bad:?}");
    }
    let penalty = pollster::block_on(PenaltyKernel::new(&gpu)).unwrap();
    let processing = penalty.bind(&gpu, &logits, 2).unwrap();
    let entries = [PenaltyEntry::new(1, 1, 0.0), PenaltyEntry::new(2, 1, 0.0), PenaltyEntry::new(3, 1, 0.0)];
    assert!(processing.write(&gpu, &Penalties::default(), &entries).is_err());
    assert!(processing.write(&gpu, &Penalties { repeat: 0.0, ..Default::default() }, &entries[..1]).is_err());
}

/// The token mask kernel bans exactly what the reference bans (exact: it only writes -inf), for
/// vocabularies that end inside a word and masks with words of none, all and some; values past
/// the vocabulary stay untouched; a greedy draw after it takes the best allowed token.
#[test]
fn token_mask_matches_reference() {
    for gpu in devices() {
        let kernel = pollster::block_on(TokenMaskKernel::new(&gpu)).unwrap();
        let sampler = pollster::block_on(SampleKernel::new(&gpu)).unwrap();
        for (n, seed) in [(1000usize, 11u64), (49152 + 5, 12)] {
            let mut rng = common::rng(seed);
            let logits = common::random_vec(&mut rng, n, 6.0);
            let words = n.div_ceil(32);
            let mask: Vec<u32> = (0..words)
                .map(|i| match i % 4 {
                    0 => 0,
                    1 => u32::MAX,
                    _ => rng.random::<u32>() & rng.random::<u32>(),
                })
                .collect();
            let guard = [7.25f32; 16];
            let padded: Vec<f32> = logits.iter().chain(&guard).copied().collect();
            let mut tensor = Tensor::from_f32(&gpu, "logits", &[padded.len()], &padded).unwrap();
            tensor.shape = vec![n];
            let binding = kernel.bind(&gpu, &tensor).unwrap();
            assert_eq!(binding.words(), words);
            assert!(binding.set(&gpu, Some(&mask[1..])).is_err(), "a mask of the wrong length is refused");
            binding.set(&gpu, Some(&mask)).unwrap();
            let mut rec = Recorder::new(&gpu);
            binding.record(&mut rec, &StepParams::new(1, 0, 0));
            rec.submit();
            tensor.shape = vec![padded.len()];
            let out = pollster::block_on(tensor.read_f32(&gpu)).unwrap();
            assert_eq!(&out[n..], &guard, "values past the vocabulary were written");
            let mut want = logits.clone();
            reference::apply_token_mask(&mask, &mut want);
            assert_eq!(out[..n], want[..], "vocab {n}");
            tensor.shape = vec![n];
            let best = reference::argmax(&want);
            assert_eq!(draws(&gpu, &sampler, &tensor, &SamplingParams::greedy(), &[0])[0].0 as usize, best);
        }
    }
}
