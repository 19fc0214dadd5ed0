// Causal grouped-query attention over the KV cache (K and V each [slots][n_kv_heads][max_ctx][HD],
// f32, or f16 with KV_F16: two values per u32 word, the first in the low half), online softmax in
// f32. Query head h reads kv head h / (n_heads / n_kv_heads). Query t of the step belongs to the
// sequence in slot rows[t].x, sits at its position rows[t].y and sees that slot's cache positions
// 0..=rows[t].y.
//
// Three kernels, one per define (their bindings differ):
// - DECODE_PARTIAL (flash-decoding, the one query of each sequence of a decode step): one
//   workgroup per (chunk of CHUNK positions, head, query) writes its chunk's (max, sum, acc[HD])
//   to `partials`;
// - DECODE_COMBINE: one workgroup per (head, query) merges the chunks' partials into the output;
// - PREFILL: one workgroup per (tile of BQ queries, head) walks the keys in blocks of BK. The
//   queries of a prefill step are one sequence's consecutive positions.
// Scores are q.k * scale, soft-capped to cap * tanh(s / cap) when `softcap` > 0 (Gemma 2); with a
// sliding window (`window` > 0) the query at position p sees keys p - window + 1..=p.
#include "subgroups"
#include "step"
#include "activation"

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    max_ctx: u32,
    // Chunks reserved per head in `partials` (max_ctx / CHUNK rounded up).
    max_chunks: u32,
    scale: f32,
    softcap: f32,
    window: u32,
}

const HD: u32 = {{HD}}u;
const HD4: u32 = HD / 4u;
const CHUNK: u32 = 256u;
// Exponent-safe "minus infinity": exp(NEG_BIG - m) is 0 and NEG_BIG - NEG_BIG is no NaN.
const NEG_BIG: f32 = -1.0e30;

fn kv_head(h: u32) -> u32 {
    return h / (params.n_heads / params.n_kv_heads);
}

// The first value of the cache row of position p of kv head kvh in `slot`.
fn cache_row(slot: u32, kvh: u32, p: u32) -> u32 {
    return ((slot * params.n_kv_heads + kvh) * params.max_ctx + p) * HD;
}

fn score_of(qk: f32) -> f32 {
    let s = qk * params.scale;
    if (params.softcap > 0.0) {
        return soft_cap(s, params.softcap);
    }
    return s;
}

// Whether the query at `query_pos` sees the key at `key_pos <= query_pos` (the window's side).
fn in_window(query_pos: u32, key_pos: u32) -> bool {
    return params.window == 0u || query_pos - key_pos < params.window;
}

// The first chunk of CHUNK positions holding a key a decode query at `pos` sees: chunks wholly
// before a sliding window are neither computed nor combined (the Rust side's
// `DecodeAttention::workgroups` dispatches enough chunks for any query of the step).
fn first_decode_chunk(pos: u32) -> u32 {
    if (params.window == 0u || pos + 1u <= params.window) {
        return 0u;
    }
    return (pos + 1u - params.window) / CHUNK;
}

#if DECODE_PARTIAL
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
#if KV_F16
@group(0) @binding(2) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;

// Values 4i..4i + 3 of the K cache.
fn k4(i: u32) -> vec4<f32> {
    let w = k_cache[i];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn v1(i: u32) -> f32 {
    return unpack2x16float(v_cache[i >> 1u])[i & 1u];
}
#else
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;

fn k4(i: u32) -> vec4<f32> {
    return k_cache[i];
}

fn v1(i: u32) -> f32 {
    return v_cache[i];
}
#endif
// [queries][n_heads][max_chunks][2 + HD]: max score, sum of exp(score - max), then the weighted
// V sum.
@group(0) @binding(4) var<storage, read_write> partials: array<f32>;
// (slot, position) of each query.
@group(0) @binding(5) var<storage, read> rows: array<vec2<u32>>;

var<workgroup> q_head: array<vec4<f32>, HD4>;
var<workgroup> weights: array<f32, CHUNK>;
// The V sum is split over V_GROUPS groups of HD threads, one position in every V_GROUPS (the
// CHUNK - V_GROUPS * HD threads left over when HD does not divide CHUNK sit it out).
const V_GROUPS: u32 = CHUNK / HD;
var<workgroup> v_parts: array<f32, CHUNK>;

// One thread per position of the chunk.
const WG: u32 = CHUNK;
#include "reduce"

@compute @workgroup_size(256)
fn decode_partial(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
#endif
) {
#if SUBGROUPS
    sg_lane = lane;
    sg_size = size;
#endif
    let query = wg.z;
    let slot = rows[query].x;
    let pos = rows[query].y;
    let chunk = first_decode_chunk(pos) + wg.x;
    let h = wg.y;
    let kvh = kv_head(h);
    let n_keys = min(pos + 1u, params.max_ctx);
    let start = chunk * CHUNK;
    // The grid covers the query of the step with the most chunks; the others' extra chunks have
    // nothing to do (the whole workgroup leaves, before any barrier).
    if (start >= n_keys) {
        return;
    }
    if (lid < HD4) {
        q_head[lid] = q[(query * params.n_heads + h) * HD4 + lid];
    }
    workgroupBarrier();

    // Scores: one position per thread, its K row read as vec4s.
    let p = start + lid;
    let valid = p < n_keys && in_window(pos, p);
    var score = NEG_BIG;
    if (valid) {
        let row = cache_row(slot, kvh, p) / 4u;
        var qk = 0.0;
        for (var d = 0u; d < HD4; d++) {
            qk += dot(q_head[d], k4(row + d));
        }
        score = score_of(qk);
    }
    let m = workgroup_max(score, lid);
    var w = 0.0;
    if (valid) {
        w = exp(score - m);
    }
    let l = workgroup_sum(w, lid);
    weights[lid] = w;
    workgroupBarrier();

    // Weighted V sum: threads (group, d) read neighbouring words of each V row.
    let d = lid % HD;
    let group = lid / HD;
    let n_here = min(CHUNK, max(n_keys, start) - start);
    var acc = 0.0;
    if (group < V_GROUPS) {
        for (var j = group; j < n_here; j += V_GROUPS) {
            acc += weights[j] * v1(cache_row(slot, kvh, start + j) + d);
        }
    }
    v_parts[lid] = acc;
    workgroupBarrier();
    if (lid < HD) {
        var total = 0.0;
        for (var g = 0u; g < V_GROUPS; g++) {
            total += v_parts[g * HD + lid];
        }
        let base = ((query * params.n_heads + h) * params.max_chunks + chunk) * (2u + HD);
        partials[base + 2u + lid] = total;
        if (lid == 0u) {
            partials[base] = m;
            partials[base + 1u] = l;
        }
    }
}
#endif

#if DECODE_COMBINE
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<vec2<u32>>;

// Thread d of (head h, query) rescales every chunk of the query to the global max and sums; any
// chunk count works.
@compute @workgroup_size(HD)
fn decode_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) d: u32) {
    let h = wg.x;
    let query = wg.y;
    let pos = rows[query].y;
    let n_chunks = (min(pos + 1u, params.max_ctx) + CHUNK - 1u) / CHUNK;
    let first = (query * params.n_heads + h) * params.max_chunks;
    let first_chunk = first_decode_chunk(pos);
    var m = NEG_BIG;
    for (var c = first_chunk; c < n_chunks; c++) {
        m = max(m, partials[(first + c) * (2u + HD)]);
    }
    var l = 0.0;
    var acc = 0.0;
    for (var c = first_chunk; c < n_chunks; c++) {
        let base = (first + c) * (2u + HD);
        let rescale = exp(partials[base] - m);
        l += partials[base + 1u] * rescale;
        acc += partials[base + 2u + d] * rescale;
    }
    out[(query * params.n_heads + h) * HD + d] = acc / l;
}
#endif

#if PREFILL
@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> q: array<f32>;
#if KV_F16
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;

// Value i of the K (or V) cache.
fn cache_value(cache_is_v: bool, i: u32) -> f32 {
    var w: u32;
    if (cache_is_v) {
        w = v_cache[i >> 1u];
    } else {
        w = k_cache[i >> 1u];
    }
    return unpack2x16float(w)[i & 1u];
}
#else
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;

fn cache_value(cache_is_v: bool, i: u32) -> f32 {
    if (cache_is_v) {
        return v_cache[i];
    }
    return k_cache[i];
}
#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> rows: array<vec2<u32>>;

const WG: u32 = 256u;
// Queries and keys per block (the Rust side's `prefill_tile`: smaller for large heads so that
// the tiles fit 16 KiB of workgroup memory).
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
// In the softmax/V phase each query row is owned by COLS threads, each with HD / COLS outputs.
const COLS: u32 = WG / BQ;
const PER_THREAD: u32 = HD / COLS;
// K/V rows padded by one word so that the score phase (thread j reads row j) hits distinct banks.
const ROW: u32 = HD + 1u;

var<workgroup> q_tile: array<f32, BQ * HD>;
var<workgroup> kv_tile: array<f32, BK * ROW>;
var<workgroup> scores: array<f32, BQ * BK>;

// Loads cache rows first..first + BK of kv head kvh of `slot` (zeros past `end`) into kv_tile.
fn load_block(cache_is_v: bool, slot: u32, kvh: u32, first: u32, end: u32, lid: u32) {
    for (var i = lid; i < BK * HD; i += WG) {
        let j = i / HD;
        var v = 0.0;
        if (first + j < end) {
            v = cache_value(cache_is_v, cache_row(slot, kvh, first) + i);
        }
        kv_tile[j * ROW + i % HD] = v;
    }
}

@compute @workgroup_size(256)
fn prefill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wg.x * BQ;
    let h = wg.y;
    if (t0 >= step.n_tokens) {
        return;
    }
    let kvh = kv_head(h);
    // The step's first query: its slot, and the position the step's consecutive positions start at.
    let slot = rows[0].x;
    let pos0 = rows[0].y;
    let n_rows = min(BQ, step.n_tokens - t0);
    for (var i = lid; i < BQ * HD; i += WG) {
        var v = 0.0;
        if (i / HD < n_rows) {
            v = q[((t0 + i / HD) * params.n_heads + h) * HD + i % HD];
        }
        q_tile[i] = v;
    }
    // Keys 0..kv_end cover the tile's last query; each row masks the keys after its own position.
    let kv_end = min(pos0 + t0 + n_rows, params.max_ctx);
    let r = lid / COLS;
    let col = lid % COLS;
    let row_pos = pos0 + t0 + r;
    var m = NEG_BIG;
    var l = 0.0;
    var acc: array<f32, PER_THREAD>;
    // With a window, blocks before the first key of the tile's first query are skipped.
    var first_key = 0u;
    if (params.window != 0u && pos0 + t0 + 1u > params.window) {
        first_key = (pos0 + t0 + 1u - params.window) / BK * BK;
    }
    for (var kb = first_key; kb < kv_end; kb += BK) {
        load_block(false, slot, kvh, kb, kv_end, lid);
        workgroupBarrier();
        if (lid < BQ * BK) {
            let sr = lid / BK;
            let sj = lid % BK;
            var s = NEG_BIG;
            let query_pos = pos0 + t0 + sr;
            if (kb + sj <= query_pos && kb + sj < kv_end && in_window(query_pos, kb + sj)) {
                var qk = 0.0;
                for (var d = 0u; d < HD; d++) {
                    qk += q_tile[sr * HD + d] * kv_tile[sj * ROW + d];
                }
                s = score_of(qk);
            }
            scores[lid] = s;
        }
        workgroupBarrier();
        load_block(true, slot, kvh, kb, kv_end, lid);
        workgroupBarrier();

        var block_max = NEG_BIG;
        for (var j = 0u; j < BK; j++) {
            block_max = max(block_max, scores[r * BK + j]);
        }
        let m_new = max(m, block_max);
        let rescale = exp(m - m_new);
        l *= rescale;
        for (var i = 0u; i < PER_THREAD; i++) {
            acc[i] *= rescale;
        }
        for (var j = 0u; j < BK; j++) {
            if (kb + j <= row_pos && kb + j < kv_end && in_window(row_pos, kb + j)) {
                let p = exp(scores[r * BK + j] - m_new);
                l += p;
                for (var i = 0u; i < PER_THREAD; i++) {
                    acc[i] += p * kv_tile[j * ROW + col + COLS * i];
                }
            }
        }
        m = m_new;
        // The next block overwrites kv_tile and scores.
        workgroupBarrier();
    }
    if (r < n_rows) {
        let dst = ((t0 + r) * params.n_heads + h) * HD;
        for (var i = 0u; i < PER_THREAD; i++) {
            out[dst + col + COLS * i] = acc[i] / l;
        }
    }
}
#endif
