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
// - PREFILL: one workgroup per (tile of BQ queries, head) walks the keys in blocks of BK, each
//   thread with a register block of scores and of output sums. The queries of a prefill step are
//   one sequence's consecutive positions.
// Scores are q.k * scale, soft-capped to cap * tanh(s / cap) when `softcap` > 0 (Gemma 2); with a
// sliding window (`window` > 0) the query at position p sees keys p - window + 1..=p.
#include "subgroups"
#include "StepParams"
#include "activation"

#include "AttentionParams"

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

#if !DECODE_COMBINE
// The bindings and cache words the decode partial and the prefill kernels share. A Word4 holds
// four cache values as the cache stores them, so that the prefill kernel stages K and V blocks
// without converting them (f16: half the workgroup memory and half the reads of f32).
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
#if KV_F16
alias Word4 = vec2<u32>;

fn unpack4(w: Word4) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
#else
alias Word4 = vec4<f32>;

fn unpack4(w: Word4) -> vec4<f32> {
    return w;
}
#endif
@group(0) @binding(2) var<storage, read> k_cache: array<Word4>;
#endif

#if DECODE_PARTIAL
#if KV_F16
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;

fn v1(i: u32) -> f32 {
    return unpack2x16float(v_cache[i >> 1u])[i & 1u];
}
#else
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;

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
fn decode_partial(@builtin(workgroup_id) wg: vec3<u32>, thread: ReduceThread) {
    let lid = reduce_setup(thread);
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
            qk += dot(q_head[d], unpack4(k_cache[row + d]));
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
@group(0) @binding(3) var<storage, read> v_cache: array<Word4>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> rows: array<vec2<u32>>;
@group(0) @binding(6) var<uniform> step: Step;

// The tile's shape comes from the Rust side's `PrefillTile` (smaller for large heads, so that it
// fits 16 KiB of workgroup memory): BQ queries attend to blocks of BK keys. Every thread keeps a
// register block of each phase's results, so that a workgroup-memory read feeds several
// multiply-adds.
const WG: u32 = 64u;
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
// Scores: a thread computes SQ x SK of them, queries qg + Q_GROUPS * i and keys kg + K_GROUPS * j
// (kg varies fastest across threads: neighbours read the same query and different keys).
const SQ: u32 = {{SQ}}u;
const SK: u32 = {{SK}}u;
const K_GROUPS: u32 = BK / SK;
const Q_GROUPS: u32 = BQ / SQ;
const SCORE_THREADS: u32 = Q_GROUPS * K_GROUPS;
// Outputs: a thread sums PR queries x two vec4 columns, queries og + OUT_Q_GROUPS * i and vec4
// columns cg and cg + COL_GROUPS (cg varies fastest: neighbours read neighbouring V words).
const PR: u32 = {{PR}}u;
const COL_GROUPS: u32 = HD4 / 2u;
const OUT_Q_GROUPS: u32 = BQ / PR;
const OUT_THREADS: u32 = OUT_Q_GROUPS * COL_GROUPS;
// K/V rows padded by one Word4 and score rows by one word, so that threads reading different
// rows at the same column hit different banks.
const ROW4: u32 = HD4 + 1u;
const SROW: u32 = BK + 1u;

var<workgroup> kv_tile: array<Word4, BK * ROW4>;
// A block's scores, then (after the softmax phase) their exp(score - running max).
var<workgroup> scores: array<f32, BQ * SROW>;
// Per query: the factor that rescales its sums to the block's new running max; after the last
// block, its softmax denominator.
var<workgroup> row_factor: array<f32, BQ>;

var<private> qk: array<f32, SQ * SK>;
var<private> acc: array<vec4<f32>, 2u * PR>;

// Whether the query at `query_pos` sees key `key` (causal, inside the cache, inside the window).
fn visible(query_pos: u32, key: u32, kv_end: u32) -> bool {
    return key <= query_pos && key < kv_end && in_window(query_pos, key);
}

// Loads cache rows first..first + BK of kv head kvh of `slot` (zeros from `end` on) into kv_tile.
fn load_block(is_v: bool, slot: u32, kvh: u32, first: u32, end: u32, lid: u32) {
    let base = cache_row(slot, kvh, first) / 4u;
    for (var i = lid; i < BK * HD4; i += WG) {
        let j = i / HD4;
        var v = Word4();
        if (first + j < end) {
            if (is_v) {
                v = v_cache[base + i];
            } else {
                v = k_cache[base + i];
            }
        }
        kv_tile[j * ROW4 + i % HD4] = v;
    }
}

// Thread `lid` (< SCORE_THREADS) writes its SQ x SK scores of the K block starting at key kb.
fn score_block(lid: u32, kb: u32, tile_pos: u32, kv_end: u32, h: u32, t0: u32, n_rows: u32) {
    let kg = lid % K_GROUPS;
    let qg = lid / K_GROUPS;
    for (var e = 0u; e < SQ * SK; e++) {
        qk[e] = 0.0;
    }
    // The thread's q rows (rows past the step's last repeat it: their results are never stored).
    var q_rows: array<u32, SQ>;
    for (var i = 0u; i < SQ; i++) {
        q_rows[i] = ((t0 + min(qg + Q_GROUPS * i, n_rows - 1u)) * params.n_heads + h) * HD4;
    }
    for (var d = 0u; d < HD4; d++) {
        for (var i = 0u; i < SQ; i++) {
            let qv = q[q_rows[i] + d];
            for (var j = 0u; j < SK; j++) {
                qk[i * SK + j] += dot(qv, unpack4(kv_tile[(kg + K_GROUPS * j) * ROW4 + d]));
            }
        }
    }
    for (var i = 0u; i < SQ; i++) {
        let r = qg + Q_GROUPS * i;
        for (var j = 0u; j < SK; j++) {
            let c = kg + K_GROUPS * j;
            var s = NEG_BIG;
            if (visible(tile_pos + r, kb + c, kv_end)) {
                s = score_of(qk[i * SK + j]);
            }
            scores[r * SROW + c] = s;
        }
    }
}

// The online softmax of query row r over the block at kb: replaces its scores with their
// weights exp(score - new max), leaves the factor rescaling its earlier sums in row_factor, and
// returns its new (max, sum of weights).
fn softmax_row(r: u32, kb: u32, query_pos: u32, kv_end: u32, m: f32, l: f32) -> vec2<f32> {
    var block_max = NEG_BIG;
    for (var j = 0u; j < BK; j++) {
        block_max = max(block_max, scores[r * SROW + j]);
    }
    let m_new = max(m, block_max);
    let factor = exp(m - m_new);
    var sum = l * factor;
    for (var j = 0u; j < BK; j++) {
        var p = 0.0;
        if (visible(query_pos, kb + j, kv_end)) {
            p = exp(scores[r * SROW + j] - m_new);
        }
        sum += p;
        scores[r * SROW + j] = p;
    }
    row_factor[r] = factor;
    return vec2<f32>(m_new, sum);
}

// Thread `lid` (< OUT_THREADS) rescales its sums and adds the block's weighted V rows.
fn accumulate_block(lid: u32) {
    let cg = lid % COL_GROUPS;
    let og = lid / COL_GROUPS;
    for (var i = 0u; i < PR; i++) {
        let factor = row_factor[og + OUT_Q_GROUPS * i];
        acc[2u * i] *= factor;
        acc[2u * i + 1u] *= factor;
    }
    for (var j = 0u; j < BK; j++) {
        let v_lo = unpack4(kv_tile[j * ROW4 + cg]);
        let v_hi = unpack4(kv_tile[j * ROW4 + cg + COL_GROUPS]);
        for (var i = 0u; i < PR; i++) {
            let p = scores[(og + OUT_Q_GROUPS * i) * SROW + j];
            acc[2u * i] += p * v_lo;
            acc[2u * i + 1u] += p * v_hi;
        }
    }
}

@compute @workgroup_size(64)
fn prefill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wg.x * BQ;
    let h = wg.y;
    if (t0 >= step.n_tokens) {
        return;
    }
    let kvh = kv_head(h);
    // The step's first query: its slot, and the position the step's consecutive positions start at.
    let slot = rows[0].x;
    let tile_pos = rows[0].y + t0;
    let n_rows = min(BQ, step.n_tokens - t0);
    for (var e = 0u; e < 2u * PR; e++) {
        acc[e] = vec4<f32>(0.0);
    }
    // Keys 0..kv_end cover the tile's last query; each row masks the keys after its own position.
    let kv_end = min(tile_pos + n_rows, params.max_ctx);
    // With a window, blocks before the first key of the tile's first query are skipped.
    var first_key = 0u;
    if (params.window != 0u && tile_pos + 1u > params.window) {
        first_key = (tile_pos + 1u - params.window) / BK * BK;
    }
    // The running max and sum of weights of query row lid (lid < BQ).
    var ml = vec2<f32>(NEG_BIG, 0.0);
    for (var kb = first_key; kb < kv_end; kb += BK) {
        load_block(false, slot, kvh, kb, kv_end, lid);
        workgroupBarrier();
        if (lid < SCORE_THREADS) {
            score_block(lid, kb, tile_pos, kv_end, h, t0, n_rows);
        }
        workgroupBarrier();
        // The K block is no longer read: V takes its place while the rows' softmax runs.
        load_block(true, slot, kvh, kb, kv_end, lid);
        if (lid < BQ) {
            ml = softmax_row(lid, kb, tile_pos + lid, kv_end, ml.x, ml.y);
        }
        workgroupBarrier();
        if (lid < OUT_THREADS) {
            accumulate_block(lid);
        }
        // The next block overwrites kv_tile, the scores and the factors.
        workgroupBarrier();
    }
    if (lid < BQ) {
        row_factor[lid] = ml.y;
    }
    workgroupBarrier();
    if (lid < OUT_THREADS) {
        let cg = lid % COL_GROUPS;
        let og = lid / COL_GROUPS;
        for (var i = 0u; i < PR; i++) {
            let r = og + OUT_Q_GROUPS * i;
            if (r < n_rows) {
                let dst = ((t0 + r) * params.n_heads + h) * HD4;
                let l = row_factor[r];
                out[dst + cg] = acc[2u * i] / l;
                out[dst + cg + COL_GROUPS] = acc[2u * i + 1u] / l;
            }
        }
    }
}
#endif
