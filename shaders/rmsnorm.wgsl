// RMSNorm: out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * weight[i], one workgroup per row,
// rows 0..step.n_tokens of the bound buffers. The sum of squares is reduced with subgroup adds
// where the device has them, else by a tree in workgroup memory.
#if SUBGROUPS
#if WGSL_ENABLE_SUBGROUPS
enable subgroups;
#endif
#endif
#include "step"

struct Params {
    n: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;

#if SUBGROUPS
// One slot per subgroup; the device's subgroups have at least 4 lanes (see GpuFeatures).
var<workgroup> partial: array<f32, 64>;
var<private> sg_lane: u32;
var<private> sg_size: u32;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        partial[lid / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG / sg_size; i++) {
        total += partial[i];
    }
    return total;
}
#else
var<workgroup> partial: array<f32, WG>;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    partial[lid] = v;
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
    }
    workgroupBarrier();
    return partial[0];
}
#endif

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
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
    let row = wg.x + wg.y * nwg.x;
    if (row >= step.n_tokens) {
        return;
    }
    let base = row * params.n;
    var sum_sq = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i];
        sum_sq += v * v;
    }
    let inv_rms = inverseSqrt(workgroup_sum(sum_sq, lid) / f32(params.n) + params.eps);
    for (var i = lid; i < params.n; i += WG) {
        out[base + i] = x[base + i] * inv_rms * weight[i];
    }
}
