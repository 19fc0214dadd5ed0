//! CPU sampling, mirroring kestrel-gpu's `shaders/sample.wgsl` and `shaders/penalties.wgsl`,
//! written the way llama.cpp's sampler chain reads: sort, truncate, renormalize, draw.

use crate::params::{Penalties, PenaltyEntry, SamplingParams};

/// Index of the largest logit; the first one when several are equal (NaN is never chosen unless
/// every value is NaN, then 0).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best
}

/// A constrained output's token mask: -inf for every logit whose bit in `allowed` (one bit per
/// token, 32 tokens per word, bit `id % 32` of word `id / 32`: llguidance's layout) is clear,
/// tokens past the words included; a word at a time, since most words of a mask allow nothing.
pub fn apply_token_mask(allowed: &[u32], logits: &mut [f32]) {
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        match allowed.get(i).copied().unwrap_or(0) {
            0 => chunk.fill(f32::NEG_INFINITY),
            u32::MAX => {}
            word => {
                for (bit, logit) in chunk.iter_mut().enumerate() {
                    if word & (1 << bit) == 0 {
                        *logit = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// Each entry's logit bias, then, for a token counted in the window, llama.cpp's repetition,
/// frequency and presence penalties. Ids past the vocabulary are ignored.
pub fn apply_penalties(logits: &[f32], entries: &[PenaltyEntry], penalties: &Penalties) -> Vec<f32> {
    let mut out = logits.to_vec();
    for e in entries {
        let Some(l) = out.get_mut(e.token as usize) else { continue };
        *l += e.bias;
        if e.count > 0 {
            *l = if *l <= 0.0 { *l * penalties.repeat } else { *l / penalties.repeat };
            *l -= e.count as f32 * penalties.frequency + penalties.presence;
        }
    }
    out
}

/// The tokens that survive top-k -> top-p -> min-p, ascending. Tokens tied with a cut-off value
/// are all kept. Top-p and min-p use the softmax at temperature 1 (llama.cpp applies the
/// temperature after them).
pub fn allowed_tokens(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
    let mut order: Vec<u32> = (0..logits.len() as u32).filter(|&i| !logits[i as usize].is_nan()).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let Some(&first) = order.first() else { return Vec::new() };
    let max = logits[first as usize];
    let keep_from = |order: &mut Vec<u32>, cutoff: f32| order.retain(|&i| logits[i as usize] >= cutoff);

    let k = params.top_k as usize;
    if k > 0 && k < order.len() {
        let cutoff = logits[order[k - 1] as usize];
        keep_from(&mut order, cutoff);
    }
    if params.top_p < 1.0 {
        let weights: Vec<f32> = order.iter().map(|&i| softmax_weight(logits[i as usize] - max)).collect();
        let target = params.top_p * weights.iter().sum::<f32>();
        let mut cum = 0.0;
        if let Some(last) = weights.iter().position(|w| {
            cum += w;
            cum >= target
        }) {
            let cutoff = logits[order[last] as usize];
            keep_from(&mut order, cutoff);
        }
    }
    if params.min_p > 0.0 {
        keep_from(&mut order, max + params.min_p.ln());
    }
    order.sort_unstable();
    order
}

/// The sampling distribution: allowed tokens ascending and their probabilities after the
/// temperature (`params.temperature` must be > 0).
pub fn distribution(logits: &[f32], params: &SamplingParams) -> (Vec<u32>, Vec<f32>) {
    let ids = allowed_tokens(logits, params);
    let weights = draw_weights(logits, &ids, params.temperature);
    let total: f32 = weights.iter().sum();
    let probs = weights.iter().map(|w| w / total).collect();
    (ids, probs)
}

/// The draw's uniform value in [0, 1): a PCG hash of the request seed and the step's draw number, as the
/// GPU computes it (24 random bits).
pub fn random_unit(seed: u32, draw: u32) -> f32 {
    (pcg(seed.wrapping_add(pcg(draw))) >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// One draw: greedy when `temperature <= 0`, else the first allowed token (ascending ids) whose
/// cumulative weight exp((logit - max) / temperature) exceeds `u * total`.
pub fn sample(logits: &[f32], params: &SamplingParams, draw: u32) -> u32 {
    if params.is_greedy() || logits.is_empty() {
        return argmax(logits) as u32;
    }
    let ids = allowed_tokens(logits, params);
    let weights = draw_weights(logits, &ids, params.temperature);
    draw_weighted(&ids, &weights, random_unit(params.seed, draw)).unwrap_or(argmax(logits) as u32)
}

/// The first of `ids` whose cumulative weight exceeds `u` (in [0, 1)) times the total; where
/// rounding leaves that past the sum, the last one with any weight; None where none has any.
pub fn draw_weighted(ids: &[u32], weights: &[f32], u: f32) -> Option<u32> {
    let target = u * weights.iter().sum::<f32>();
    let mut cum = 0.0;
    for (&id, &w) in ids.iter().zip(weights) {
        cum += w;
        if w > 0.0 && cum > target {
            return Some(id);
        }
    }
    ids.iter().zip(weights).rev().find(|(_, &w)| w > 0.0).map(|(&id, _)| id)
}

fn draw_weights(logits: &[f32], ids: &[u32], temperature: f32) -> Vec<f32> {
    let max = logits[argmax(logits)];
    ids.iter().map(|&i| softmax_weight((logits[i as usize] - max) / temperature)).collect()
}

/// exp(x), with the weight of a banned token (-inf - -inf = NaN) being 0, as on the GPU.
fn softmax_weight(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.exp()
    }
}

/// PCG hash (O'Neill, "RXS M XS"), the GPU's `pcg`.
fn pcg(v: u32) -> u32 {
    let state = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
    (word >> 22) ^ word
}
