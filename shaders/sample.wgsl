// Token selection on the GPU: only the chosen id (and its probability) is read back.
//
// Entry points (all bind: 0 params, 1 src, 2 dst; `sample` also 3 step):
// - argmax_partials: many workgroups, each reduces 1024 logits to (max, lowest index of the max,
//   sum of exp(logit - max)) written to dst as 3 words.
// - argmax_final: one workgroup combines those records: dst[0] = token, dst[1] = its softmax
//   probability (f32 bits) over the whole vocabulary.
// - sample: one workgroup; llama.cpp's chain top-k -> top-p -> min-p -> temperature -> dist.
//   Every filter keeps the tokens whose logit is >= a threshold, so the allowed set is
//   {i : logit_i >= T}; T is found by a 16-way search over the f32 order (count for top-k,
//   softmax mass for top-p, closed form for min-p). Tokens tied with a threshold are all kept.
//   Then one uniform u in [0,1) from a PCG hash of (params.seed, step.draw) selects the first
//   allowed token, in index order, whose cumulative weight exp((logit - max) / temperature)
//   exceeds u * total. dst[0] = token, dst[1] = its probability under that distribution.
#include "StepParams"
// The tree reductions on every device (the entry points take no subgroup built-ins): the sums
// are added in one order everywhere.
#include "reduce" SUBGROUPS=0

#include "SampleUniform"

@group(0) @binding(0) var<uniform> params: Params;
// Logits (sample, argmax_partials) or partial records (argmax_final), read as raw words so that
// a record's index is never reinterpreted as a (denormal) float.
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<uniform> step: Step;

const WG: u32 = 256u;
// Logits per argmax_partials workgroup (4 per thread); mirrored by ARGMAX_CHUNK in sample.rs.
const CHUNK: u32 = 1024u;
// Probes per search pass: each pass narrows the threshold's range 16-fold (8 passes for 32 bits).
const PROBES: u32 = 15u;
const NONE: u32 = 0xffffffffu;

// -inf as a runtime value: a constant expression may not evaluate to an infinity in WGSL.
var<private> neg_inf_bits: u32 = 0xff800000u;

var<workgroup> red_f: array<f32, 256>;
var<workgroup> red_u: array<u32, 256>;
// Probe sums handed down during the search's fold (7.5 KiB), and the narrowed range.
var<workgroup> fold: array<array<f32, 15>, 128>;
var<workgroup> search_range: vec2<u32>;
// Decision of thread 0 in the draw, broadcast to the workgroup.
var<workgroup> pick_chunk: u32;
var<workgroup> pick_rest: f32;
var<workgroup> pick_total: f32;

// Monotone map of f32 onto u32 (a < b  <=>  key(a) < key(b)); -0 maps with +0 so that key
// comparisons agree with f32 comparisons for every non-NaN value.
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if (b == 0x80000000u) {
        return 0x80000000u;
    }
    return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}

// (v, i) beats (bv, bi): larger value, or equal value and lower index (llama.cpp's greedy keeps
// the first maximum). NaN never wins.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

fn neg_inf() -> f32 {
    return bitcast<f32>(neg_inf_bits);
}

fn logit(i: u32) -> f32 {
    return bitcast<f32>(src[i]);
}

fn exp_or_zero(x: f32) -> f32 {
    // exp(-inf - -inf) would be NaN: a banned token (or an all-banned chunk) weighs nothing.
    // -FLT_MAX exactly (hex): Tint (Chrome) rejects a decimal literal that rounds past it.
    return select(exp(x), 0.0, x != x || x < -0x1.fffffep+127f);
}

fn reduce_min_u32(t: u32, v: u32) -> u32 {
    red_u[t] = v;
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (t < s) {
            red_u[t] = min(red_u[t], red_u[t + s]);
        }
    }
    let r = workgroupUniformLoad(&red_u[0]);
    workgroupBarrier();
    return r;
}

// Reduces (value, index) pairs to the best one; returns it with the index in red_u[0] too.
fn reduce_argmax(t: u32, v: f32, i: u32) -> vec2<u32> {
    red_f[t] = v;
    red_u[t] = i;
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (t < s && better(red_f[t + s], red_u[t + s], red_f[t], red_u[t])) {
            red_f[t] = red_f[t + s];
            red_u[t] = red_u[t + s];
        }
    }
    let best_v = workgroupUniformLoad(&red_f[0]);
    let best_i = workgroupUniformLoad(&red_u[0]);
    workgroupBarrier();
    return vec2<u32>(bitcast<u32>(best_v), best_i);
}

@compute @workgroup_size(256)
fn argmax_partials(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wg.x + wg.y * nwg.x;
    let base = group * CHUNK;
    if (base >= params.n) {
        return;
    }
    var vals: array<f32, 4>;
    var bv = neg_inf();
    var bi = NONE;
    for (var e = 0u; e < 4u; e++) {
        let i = base + e * WG + t;
        vals[e] = neg_inf();
        if (i < params.n) {
            vals[e] = logit(i);
            if (better(vals[e], i, bv, bi)) {
                bv = vals[e];
                bi = i;
            }
        }
    }
    let best = reduce_argmax(t, bv, bi);
    let m = bitcast<f32>(best.x);
    var s = 0.0;
    for (var e = 0u; e < 4u; e++) {
        s += exp_or_zero(vals[e] - m);
    }
    let total = workgroup_sum(s, t);
    if (t == 0u) {
        dst[3u * group] = best.x;
        dst[3u * group + 1u] = best.y;
        dst[3u * group + 2u] = bitcast<u32>(total);
    }
}

@compute @workgroup_size(256)
fn argmax_final(@builtin(local_invocation_index) t: u32) {
    var bv = neg_inf();
    var bi = NONE;
    for (var g = t; g < params.n; g += WG) {
        let v = bitcast<f32>(src[3u * g]);
        let i = src[3u * g + 1u];
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    let best = reduce_argmax(t, bv, bi);
    let m = bitcast<f32>(best.x);
    // Z = sum_g s_g * exp(m_g - m): each record's sum rescaled to the global maximum.
    var z = 0.0;
    for (var g = t; g < params.n; g += WG) {
        z += bitcast<f32>(src[3u * g + 2u]) * exp_or_zero(bitcast<f32>(src[3u * g]) - m);
    }
    let total = workgroup_sum(z, t);
    if (t == 0u) {
        dst[0] = best.y;
        dst[1] = bitcast<u32>(1.0 / total);
    }
}

// PCG hash (O'Neill), as in reference::sample::random_unit.
fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Largest threshold key t in [lo, hi] whose measure M(t) = sum over tokens with
// floor_key <= key <= .. and key >= t of (mass ? exp(logit - max) : 1) is >= goal.
// Requires M(lo) >= goal. M only grows as t falls, so the passing probes form a prefix.
fn search(t: u32, lo_in: u32, hi_in: u32, floor_key: u32, mass: bool, max_v: f32, goal: f32) -> u32 {
    var lo = lo_in;
    var hi = hi_in;
    loop {
        if (lo >= hi) {
            break;
        }
        let span = hi - lo;
        let stride = span / (PROBES + 1u) + select(0u, 1u, span % (PROBES + 1u) != 0u);
        var acc: array<f32, 15>;
        for (var j = 0u; j < PROBES; j++) {
            acc[j] = 0.0;
        }
        for (var i = t; i < params.n; i += WG) {
            let v = logit(i);
            let k = key(v);
            if (k < floor_key || k < lo) {
                continue;
            }
            let w = select(1.0, exp_or_zero(v - max_v), mass);
            for (var j = 0u; j < PROBES; j++) {
                // Probe j is lo + stride * (j + 1); compared as an offset to avoid overflow.
                if (k - lo >= stride * (j + 1u)) {
                    acc[j] += w;
                }
            }
        }
        // Tree-fold all probes at once: the upper half of the active threads hands its sums to
        // the lower half (2 barriers per level instead of 2 per level per probe).
        for (var half = WG / 2u; half > 0u; half = half >> 1u) {
            if (t >= half && t < 2u * half) {
                for (var j = 0u; j < PROBES; j++) {
                    fold[t - half][j] = acc[j];
                }
            }
            workgroupBarrier();
            if (t < half) {
                for (var j = 0u; j < PROBES; j++) {
                    acc[j] += fold[t][j];
                }
            }
            workgroupBarrier();
        }
        if (t == 0u) {
            var new_lo = lo;
            var new_hi = hi;
            for (var j = 0u; j < PROBES; j++) {
                let offset = stride * (j + 1u);
                if (offset <= span) {
                    if (acc[j] >= goal) {
                        new_lo = lo + offset;
                    } else if (new_hi == hi) {
                        new_hi = lo + offset - 1u;
                    }
                }
            }
            search_range = vec2<u32>(new_lo, new_hi);
        }
        let range = workgroupUniformLoad(&search_range);
        lo = range.x;
        hi = range.y;
    }
    return lo;
}

fn weight(i: u32, threshold: u32, max_v: f32) -> f32 {
    let v = logit(i);
    return select(0.0, exp_or_zero((v - max_v) / params.temperature), key(v) >= threshold);
}

@compute @workgroup_size(256)
fn sample(@builtin(local_invocation_index) t: u32) {
    let n = params.n;
    var bv = neg_inf();
    var bi = NONE;
    var kmin = NONE;
    for (var i = t; i < n; i += WG) {
        let v = logit(i);
        if (better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
        kmin = min(kmin, key(v));
    }
    let best = reduce_argmax(t, bv, bi);
    let max_v = bitcast<f32>(best.x);
    let max_key = key(max_v);
    let min_key = reduce_min_u32(t, kmin);

    // top-k: the k-th largest logit (count of tokens >= it is >= k).
    var top_k_key = min_key;
    if (params.top_k > 0u && params.top_k < n) {
        top_k_key = search(t, min_key, max_key, min_key, false, max_v, f32(params.top_k));
    }
    var threshold = top_k_key;
    // top-p over the top-k survivors' softmax (temperature 1, as llama.cpp applies it later).
    if (params.top_p < 1.0) {
        var z = 0.0;
        for (var i = t; i < n; i += WG) {
            let v = logit(i);
            if (key(v) >= top_k_key) {
                z += exp_or_zero(v - max_v);
            }
        }
        let mass = workgroup_sum(z, t);
        threshold = search(t, top_k_key, max_key, top_k_key, true, max_v, params.top_p * mass);
    }
    // min-p: p_i >= min_p * p_max  <=>  logit_i >= max + ln(min_p).
    if (params.min_p > 0.0) {
        threshold = max(threshold, key(max_v + log(params.min_p)));
    }

    let u = f32(pcg(params.seed + pcg(step.draw)) >> 8u) * (1.0 / 16777216.0);
    // Draw: narrow [a, b) to the 256-way chunk where the cumulative weight crosses the target,
    // until chunks are single tokens.
    var a = 0u;
    var b = n;
    var first_level = true;
    var token = best.y;
    var prob = 0.0;
    loop {
        let sub = (b - a + WG - 1u) / WG;
        let start = a + t * sub;
        let end = min(start + sub, b);
        var acc = 0.0;
        for (var i = start; i < end; i++) {
            acc += weight(i, threshold, max_v);
        }
        red_f[t] = acc;
        workgroupBarrier();
        if (t == 0u) {
            var total = 0.0;
            for (var j = 0u; j < WG; j++) {
                total += red_f[j];
            }
            var rest = pick_rest;
            if (first_level) {
                pick_total = total;
                rest = u * total;
            }
            // The first chunk whose cumulative weight exceeds `rest`; if rounding left none, the
            // last chunk with any weight (NONE if the allowed set weighs nothing at all).
            var chosen = NONE;
            var before = 0.0;
            var cum = 0.0;
            for (var j = 0u; j < WG; j++) {
                let w = red_f[j];
                if (w > 0.0) {
                    chosen = j;
                    before = cum;
                    if (cum + w > rest) {
                        break;
                    }
                }
                cum += w;
            }
            pick_chunk = chosen;
            pick_rest = min(rest - before, red_f[min(chosen, WG - 1u)]);
            red_u[0] = bitcast<u32>(red_f[min(chosen, WG - 1u)]);
        }
        let chosen = workgroupUniformLoad(&pick_chunk);
        if (chosen == NONE) {
            break;
        }
        if (sub == 1u) {
            token = a + chosen;
            prob = bitcast<f32>(red_u[0]) / pick_total;
            break;
        }
        first_level = false;
        a = a + chosen * sub;
        b = min(a + sub, b);
    }
    if (t == 0u) {
        dst[0] = token;
        dst[1] = bitcast<u32>(prob);
    }
}
