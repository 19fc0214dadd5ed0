// RoPE for n_tokens rows of the fused QKV output ([q heads | k heads | v heads] per token):
// rotates Q into `q_out` ([t][n_heads][head_dim]) and K into the KV cache at positions
// step.pos + t, and copies V into the cache unrotated. One thread per pair of values. Rotated
// values are scaled by `mscale` (the attention factor; YaRN's magnitude correction). A layer
// without RoPE (SmolLM3's every fourth) has `rotate` 0: Q and K are copied unchanged.
//
// The angle pos * inv_freq[i] reaches thousands of radians, where an f32 product loses ~1e-3 rad
// and WGSL's sin/cos promise nothing outside [-pi, pi]. So each pair's frequency arrives as a
// 64-bit fixed-point fraction of a turn per position (`turns`, lo/hi words); the integer product
// with the position wraps exactly to the fraction of a turn, reduced to [-pi, pi) before sin/cos.
#include "step"

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    max_ctx: u32,
    // 0: pairs (2i, 2i + 1) as ggml's NORM mode; 1: pairs (i, i + head_dim / 2) as NEOX.
    neox: u32,
    rotate: u32,
    mscale: f32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> turns: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;

const WG: u32 = 256u;
const TWO_PI_OVER_2_32: f32 = 1.4629180792671596e-9;

// High 32 bits of the 64-bit product a * b.
fn mul_hi(a: u32, b: u32) -> u32 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
}

// Angle of pair i at position pos, in [-pi, pi).
fn angle(i: u32, pos: u32) -> f32 {
    let f = turns[i];
    let turn = pos * f.y + mul_hi(pos, f.x);
    return f32(bitcast<i32>(turn)) * TWO_PI_OVER_2_32;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n_pairs = params.head_dim / 2u;
    let heads = params.n_heads + 2u * params.n_kv_heads;
    let pairs_per_token = heads * n_pairs;
    let idx = gid.x + gid.y * nwg.x * WG;
    let t = idx / pairs_per_token;
    let pos = step.pos + t;
    if (t >= step.n_tokens || pos >= params.max_ctx) {
        return;
    }
    let head = (idx % pairs_per_token) / n_pairs;
    let i = idx % n_pairs;
    let is_v = head >= params.n_heads + params.n_kv_heads;
    // V is copied with NORM offsets: neighbouring threads then move neighbouring words.
    var a = 2u * i;
    var b = 2u * i + 1u;
    if (params.neox != 0u && !is_v) {
        a = i;
        b = i + n_pairs;
    }
    let src = (t * heads + head) * params.head_dim;
    var x0 = qkv[src + a];
    var x1 = qkv[src + b];
    if (!is_v && params.rotate != 0u) {
        let theta = angle(i, pos);
        let c = cos(theta) * params.mscale;
        let s = sin(theta) * params.mscale;
        let r0 = x0 * c - x1 * s;
        x1 = x0 * s + x1 * c;
        x0 = r0;
    }
    if (head < params.n_heads) {
        let dst = (t * params.n_heads + head) * params.head_dim;
        q_out[dst + a] = x0;
        q_out[dst + b] = x1;
    } else if (!is_v) {
        let dst = ((head - params.n_heads) * params.max_ctx + pos) * params.head_dim;
        k_cache[dst + a] = x0;
        k_cache[dst + b] = x1;
    } else {
        let dst = ((head - params.n_heads - params.n_kv_heads) * params.max_ctx + pos) * params.head_dim;
        v_cache[dst + a] = x0;
        v_cache[dst + b] = x1;
    }
}
