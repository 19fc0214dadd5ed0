// An encoder's bidirectional attention over packed inputs: query token t attends to every key of
// its own input, spans[t] = [start, end), and to no other (no causal mask). Q, K and V are read
// from the fused QKV rows (`stride` values per token; Q's heads at 0, K's at k_offset, V's at
// v_offset), the output written to `out` ([t][n_heads * HD]).
//
// One workgroup per (token, head). The keys are walked in tiles of WG: each thread scores one
// key of the tile, the tile's max and sum are workgroup reductions (reduce.wgsl), and the
// running max / sum / output (online softmax, f32) are rescaled per tile; thread j holds output
// dimensions j, j + WG, ... of the head.
#include "subgroups"
#include "StepParams"

#include "EncoderAttentionParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> spans: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const HD: u32 = {{HD}}u;
const WG: u32 = 64u;
const DPT: u32 = (HD + WG - 1u) / WG;
// Exponent-safe "minus infinity": exp(NEG_BIG - m) is 0 and NEG_BIG - NEG_BIG is no NaN.
const NEG_BIG: f32 = -1.0e30;

var<workgroup> q_tile: array<f32, HD>;
var<workgroup> p_tile: array<f32, WG>;

#include "reduce"

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, thread: ReduceThread) {
    let lid = reduce_setup(thread);
    let item = wg.x + wg.y * nwg.x;
    let t = item / params.n_heads;
    if (t >= step.n_tokens) {
        return;
    }
    let head = item % params.n_heads;
    let span = spans[t];
    for (var d = lid; d < HD; d += WG) {
        q_tile[d] = qkv[t * params.stride + head * HD + d] * params.scale;
    }
    workgroupBarrier();
    var m = NEG_BIG;
    var l = 0.0;
    var acc: array<f32, DPT>;
    for (var first = span.x; first < span.y; first += WG) {
        let key = first + lid;
        var s = NEG_BIG;
        if (key < span.y) {
            let k_base = key * params.stride + params.k_offset + head * HD;
            var qk = 0.0;
            for (var d = 0u; d < HD; d++) {
                qk += q_tile[d] * qkv[k_base + d];
            }
            s = qk;
        }
        let m_new = max(m, workgroup_max(s, lid));
        var p = 0.0;
        if (key < span.y) {
            p = exp(s - m_new);
        }
        p_tile[lid] = p;
        let alpha = exp(m - m_new);
        // The sum's barrier also makes every thread's p_tile entry visible.
        l = l * alpha + workgroup_sum(p, lid);
        let keys = min(WG, span.y - first);
        for (var j = 0u; j < DPT; j++) {
            acc[j] *= alpha;
        }
        for (var k = 0u; k < keys; k++) {
            let v_base = (first + k) * params.stride + params.v_offset + head * HD;
            let w = p_tile[k];
            for (var j = 0u; j < DPT; j++) {
                let d = lid + j * WG;
                if (d < HD) {
                    acc[j] += w * qkv[v_base + d];
                }
            }
        }
        m = m_new;
        // Every thread has read this tile's weights before the next tile overwrites them.
        workgroupBarrier();
    }
    for (var j = 0u; j < DPT; j++) {
        let d = lid + j * WG;
        if (d < HD) {
            out[t * params.n_heads * HD + head * HD + d] = acc[j] / l;
        }
    }
}
