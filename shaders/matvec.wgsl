// Matrix-vector product for decode (one token): y[n] = sum_k W[n][k] * x[k], with W in the GPU
// weight layout of quant.wgsl. A workgroup computes one output row at a time (several in turn
// for tall matrices): its threads stride over the row in units of 8 weights, so neighbouring
// threads read neighbouring words, then reduce.
//
// Epilogues (defines): BIAS adds bias[n]; ACCUMULATE adds the old y[n] (the in-place residual
// add, y += W x: each y[n] is read then written by the same invocation); SWIGLU computes
// y[n] = silu(Wg[n] . x) * (Wu[n] . x) with the gate in `w` and the up projection in `w_up`.
#if SUBGROUPS
// Browsers need the directive; naga (native) rejects it and enables subgroups by device feature.
#if WGSL_ENABLE_SUBGROUPS
enable subgroups;
#endif
#endif
#include "quant"

@group(0) @binding(0) var<uniform> params: WeightParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
#if SWIGLU
@group(0) @binding(4) var<storage, read> w_up: array<u32>;
#endif
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif

const WG: u32 = 64u;

// Per-thread partial dot products: .x for `w`, .y for `w_up` (SWIGLU only, else 0).
var<workgroup> partials: array<vec2<f32>, WG>;

fn x4(first: u32) -> vec4<f32> {
    return vec4<f32>(x[first], x[first + 1u], x[first + 2u], x[first + 3u]);
}

fn silu(a: f32) -> f32 {
    return a / (1.0 + exp(-a));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
    // A workgroup handles `rows_per_group` consecutive rows, one after the other: tall matrices
    // (the LM head) then need fewer, longer-lived workgroups, while short ones keep one row per
    // workgroup so that a large GPU still gets enough workgroups.
    let first_row = (wg.x + wg.y * nwg.x) * params.rows_per_group;
    for (var i = 0u; i < params.rows_per_group; i++) {
        let row = first_row + i;
        if (row >= params.rows) {
            break;
        }
#if SUBGROUPS
        let total = row_dot(row, lid, lane, sg_size);
#else
        let total = row_dot(row, lid);
#endif
        if (lid == 0u) {
            store(row, total);
        }
        // `partials` is rewritten by the next row.
        workgroupBarrier();
    }
}

// The row's dot product(s), valid in invocation 0.
#if SUBGROUPS
fn row_dot(row: u32, lid: u32, lane: u32, sg_size: u32) -> vec2<f32> {
#else
fn row_dot(row: u32, lid: u32) -> vec2<f32> {
#endif
    let units = params.cols / 8u;
    var sums = vec2<f32>(0.0);
    for (var u = lid; u < units; u += WG) {
        let cols = unit_cols(u);
        let xlo = x4(cols.x);
        let xhi = x4(cols.y);
        let gate = load_unit(row, u);
        sums.x += dot(gate.lo, xlo) + dot(gate.hi, xhi);
#if SWIGLU
        let up = load_up_unit(row, u);
        sums.y += dot(up.lo, xlo) + dot(up.hi, xhi);
#endif
    }
#if DENSE
    // The columns after the last whole unit (fewer than 8), one per thread.
    let col = units * 8u + lid;
    if (col < params.cols) {
        sums.x += load_dense(row, col) * x[col];
#if SWIGLU
        sums.y += load_up_dense(row, col) * x[col];
#endif
    }
#endif

#if SUBGROUPS
    // Subgroups of a 1-D workgroup are consecutive ranges of local_invocation_index on every
    // implementation, so subgroup i's sum goes to partials[i].
    let sg_sum = subgroupAdd(sums);
    if (lane == 0u) {
        partials[lid / sg_size] = sg_sum;
    }
    workgroupBarrier();
    var total = vec2<f32>(0.0);
    for (var i = 0u; i < (WG + sg_size - 1u) / sg_size; i++) {
        total += partials[i];
    }
    return total;
#else
    partials[lid] = sums;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            partials[lid] += partials[lid + stride];
        }
        workgroupBarrier();
    }
    return partials[0];
#endif
}

fn store(row: u32, total: vec2<f32>) {
#if SWIGLU
    var value = silu(total.x) * total.y;
#else
    var value = total.x;
#endif
#if BIAS
    value += bias[row];
#endif
    let index = params.out_offset + row;
#if ACCUMULATE
    value += y[index];
#endif
    y[index] = value;
}
