// RoPE for n_tokens rows of the fused QKV output ([q heads | k heads | v heads] per token):
// rotates Q into `q_out` ([t][n_heads][head_dim]) and K into the KV cache of slot rows[t].x at
// position rows[t].y (the step's tokens may belong to different sequences), and copies V into
// the cache unrotated. One thread per two neighbouring pairs of
// values, so that with an f16 cache (KV_F16: two values per u32 word, the first in the low half)
// each thread writes whole words in either pairing. Rotated values are scaled by `mscale` (the
// attention factor; YaRN's magnitude correction). A layer without RoPE (SmolLM3's every fourth)
// has `rotate` 0: Q and K are copied unchanged.
//
// The angle pos * inv_freq[i] reaches thousands of radians, where an f32 product loses ~1e-3 rad
// and WGSL's sin/cos promise nothing outside [-pi, pi]. So each pair's frequency arrives as a
// 64-bit fixed-point fraction of a turn per position (`turns`, lo/hi words); the integer product
// with the position wraps exactly to the fraction of a turn, reduced to [-pi, pi) before sin/cos.
#include "StepParams"

#include "RopeParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> turns: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;
#if KV_F16
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
#else
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;
#endif
// (slot, position) of each token of the step.
@group(0) @binding(7) var<storage, read> rows: array<vec2<u32>>;

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

// Rotates pair i = (x0, x1) at `pos`, or leaves it (V, and layers without RoPE).
fn rotated(x: vec2<f32>, i: u32, pos: u32, rotate: bool) -> vec2<f32> {
    if (!rotate) {
        return x;
    }
    let theta = angle(i, pos);
    let c = cos(theta) * params.mscale;
    let s = sin(theta) * params.mscale;
    return vec2<f32>(x.x * c - x.y * s, x.x * s + x.y * c);
}

// Stores pairs A = (a.x at `offs.x`, a.y at `offs.y`) and B = (b.x at `offs.z`, b.y at `offs.w`)
// of the cache row starting at `row`. NORM pairs are whole f16 words (A's values neighbour); NEOX
// pairs neighbour their partner pair instead (A's first value is next to B's first).
fn store_cache(is_v: bool, row: u32, offs: vec4<u32>, a: vec2<f32>, b: vec2<f32>, neox: bool) {
#if KV_F16
    var w0 = pack2x16float(a);
    var w1 = pack2x16float(b);
    var i0 = (row + offs.x) / 2u;
    var i1 = (row + offs.z) / 2u;
    if (neox) {
        w0 = pack2x16float(vec2<f32>(a.x, b.x));
        w1 = pack2x16float(vec2<f32>(a.y, b.y));
        i1 = (row + offs.y) / 2u;
    }
    if (is_v) {
        v_cache[i0] = w0;
        v_cache[i1] = w1;
    } else {
        k_cache[i0] = w0;
        k_cache[i1] = w1;
    }
#else
    let at = vec4<u32>(row) + offs;
    if (is_v) {
        v_cache[at.x] = a.x;
        v_cache[at.y] = a.y;
        v_cache[at.z] = b.x;
        v_cache[at.w] = b.y;
    } else {
        k_cache[at.x] = a.x;
        k_cache[at.y] = a.y;
        k_cache[at.z] = b.x;
        k_cache[at.w] = b.y;
    }
#endif
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n_pairs = params.head_dim / 2u;
    // Thread j of a head takes pairs 2j and 2j + 1 (head_dim is a multiple of 4).
    let n_quads = n_pairs / 2u;
    let heads = params.n_heads + 2u * params.n_kv_heads;
    let quads_per_token = heads * n_quads;
    let idx = gid.x + gid.y * nwg.x * WG;
    let t = idx / quads_per_token;
    if (t >= step.n_tokens) {
        return;
    }
    let slot = rows[t].x;
    let pos = rows[t].y;
    if (pos >= params.max_ctx) {
        return;
    }
    let head = (idx % quads_per_token) / n_quads;
    let j = idx % n_quads;
    let is_v = head >= params.n_heads + params.n_kv_heads;
    // V is copied with NORM offsets: neighbouring threads then move neighbouring words.
    let neox = params.neox != 0u && !is_v;
    // The value offsets of pair 2j (x, y) and pair 2j + 1 (z, w) within a head's row.
    var offs = vec4<u32>(4u * j, 4u * j + 1u, 4u * j + 2u, 4u * j + 3u);
    if (neox) {
        offs = vec4<u32>(2u * j, 2u * j + n_pairs, 2u * j + 1u, 2u * j + 1u + n_pairs);
    }
    let src = (t * heads + head) * params.head_dim;
    let rotate = !is_v && params.rotate != 0u;
    let a = rotated(vec2<f32>(qkv[src + offs.x], qkv[src + offs.y]), 2u * j, pos, rotate);
    let b = rotated(vec2<f32>(qkv[src + offs.z], qkv[src + offs.w]), 2u * j + 1u, pos, rotate);
    if (head < params.n_heads) {
        let dst = (t * params.n_heads + head) * params.head_dim;
        q_out[dst + offs.x] = a.x;
        q_out[dst + offs.y] = a.y;
        q_out[dst + offs.z] = b.x;
        q_out[dst + offs.w] = b.y;
    } else {
        var kv = head - params.n_heads;
        if (is_v) {
            kv -= params.n_kv_heads;
        }
        store_cache(is_v, ((slot * params.n_kv_heads + kv) * params.max_ctx + pos) * params.head_dim, offs, a, b, neox);
    }
}
