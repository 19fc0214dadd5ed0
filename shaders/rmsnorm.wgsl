// RMSNorm: out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * weight[i], one workgroup per row r
// of n values. A token has `rows_per_token` rows: 1 for a whole activation row, the head count
// for a per-head norm (Qwen3's Q/K norm, which normalizes the heads of the fused QKV row in
// place: IN_PLACE). Tokens 0..step.n_tokens are normalized. With ACCUMULATE the result is added
// to `out` (Gemma's post-attention and post-FFN norms, added into the hidden state). The sum of
// squares is reduced by `workgroup_sum` (reduce.wgsl).
#include "subgroups"
#include "StepParams"

#include "RmsNormParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
#if IN_PLACE
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
#else
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
#endif

const WG: u32 = 256u;

#include "reduce"

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, thread: ReduceThread) {
    let lid = reduce_setup(thread);
    let row = wg.x + wg.y * nwg.x;
    if (row >= step.n_tokens * params.rows_per_token) {
        return;
    }
    let token = row / params.rows_per_token;
    let base = token * params.token_stride + params.offset + (row % params.rows_per_token) * params.n;
    var sum_sq = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i];
        sum_sq += v * v;
    }
    let inv_rms = inverseSqrt(workgroup_sum(sum_sq, lid) / f32(params.n) + params.eps);
    for (var i = lid; i < params.n; i += WG) {
#if IN_PLACE
        x[base + i] = x[base + i] * inv_rms * weight[i];
#elif ACCUMULATE
        out[base + i] += x[base + i] * inv_rms * weight[i];
#else
        out[base + i] = x[base + i] * inv_rms * weight[i];
#endif
    }
}
