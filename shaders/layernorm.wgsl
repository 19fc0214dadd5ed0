// LayerNorm (BERT's, as ggml_norm then the weight and bias): out[r][i] = (x[r][i] - mean) /
// sqrt(var + eps) * weight[i] + bias[i], one workgroup per row r of n values, rows
// 0..step.n_tokens. The mean and then the variance of the centred values are two workgroup sums
// (reduce.wgsl), as ggml computes them (two passes, not E[x^2] - E[x]^2, which cancels).
#include "subgroups"
#include "StepParams"

#include "LayerNormParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;

#include "reduce"

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, thread: ReduceThread) {
    let lid = reduce_setup(thread);
    let row = wg.x + wg.y * nwg.x;
    if (row >= step.n_tokens) {
        return;
    }
    let base = row * params.n;
    var sum = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        sum += x[base + i];
    }
    let mean = workgroup_sum(sum, lid) / f32(params.n);
    var sum_sq = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i] - mean;
        sum_sq += v * v;
    }
    let scale = inverseSqrt(workgroup_sum(sum_sq, lid) / f32(params.n) + params.eps);
    for (var i = lid; i < params.n; i += WG) {
        out[base + i] = (x[base + i] - mean) * scale * weight[i] + bias[i];
    }
}
