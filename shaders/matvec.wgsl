// Matrix-vector product for decode (one token): y[n] = sum_k W[n][k] * x[k], with W in the GPU
// weight layout of quant.wgsl. The 64 threads of a workgroup split into slots of
// `params.row_threads` threads (a power of two the host sizes to the row length, so that each
// thread reads a few units of 8 weights); each slot computes one row, so a workgroup computes
// 64 / row_threads rows at once, and `rows_per_group` of them in passes. Within a slot,
// neighbouring threads read neighbouring words. One barrier per pass (not per row) hands the
// slot's partial sums to its first thread: rows as short as a small model's 576 columns leave
// little work per row, and a barrier per row would cost more than the row.
//
// Epilogues (defines): BIAS adds bias[n]; ACCUMULATE adds the old y[n] (the in-place residual
// add, y += W x: each y[n] is read then written by the same invocation); SWIGLU computes
// y[n] = silu(Wg[n] . x) * (Wu[n] . x) with the gate in `w` and the up projection in `w_up`.
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
) {
    let slots = WG / params.row_threads;
    let slot = lid / params.row_threads;
    let thread = lid % params.row_threads;
    let first_row = (wg.x + wg.y * nwg.x) * params.rows_per_group;
    for (var done = 0u; done < params.rows_per_group; done += slots) {
        // Uniform: the whole workgroup leaves together, so the barriers below stay uniform.
        if (first_row + done >= params.rows) {
            break;
        }
        let row = first_row + done + slot;
        var sums = vec2<f32>(0.0);
        if (row < params.rows) {
            sums = row_partial(row, thread);
        }
        partials[lid] = sums;
        workgroupBarrier();
        if (thread == 0u && row < params.rows) {
            var total = vec2<f32>(0.0);
            for (var i = 0u; i < params.row_threads; i++) {
                total += partials[lid + i];
            }
            store(row, total);
        }
        // `partials` is rewritten by the next pass.
        workgroupBarrier();
    }
}

// This thread's share of the row's dot product(s): units thread, thread + row_threads, ...
fn row_partial(row: u32, thread: u32) -> vec2<f32> {
    let units = params.cols / 8u;
    var sums = vec2<f32>(0.0);
    for (var u = thread; u < units; u += params.row_threads) {
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
    // The columns after the last whole unit (fewer than 8).
    for (var col = units * 8u + thread; col < params.cols; col += params.row_threads) {
        sums.x += load_dense(row, col) * x[col];
#if SWIGLU
        sums.y += load_up_dense(row, col) * x[col];
#endif
    }
#endif
    return sums;
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
