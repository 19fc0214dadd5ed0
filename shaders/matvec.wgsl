// Matrix-vector product for decode (one token): y[n] = sum_k W[n][k] * x[k], with W in the GPU
// weight layout of quant.wgsl.
//
// A workgroup computes ROWS consecutive rows, one per lane, and SLICES threads share a row, each
// taking every SLICES-th 32-weight block of it. In the tiled weight layout the lanes of a slice
// read consecutive words of consecutive rows (coalesced), while all of them read the same
// activations at the same time: x is loaded once for the ROWS rows (a broadcast on a GPU, a
// scalar load on a CPU-emulated one) instead of once per row. A block's scale words are loaded
// once for its 4 units of 8 weights. With SLICES = 1 (adapters with few, wide cores) there is no
// reduction and no barrier at all; with more slices (GPUs, which need many threads in flight)
// one barrier hands the slices' partial sums to slice 0. The host picks SLICES per adapter.
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

// Mirror `MATVEC_ROWS` and the slice count in crates/kestrel-gpu/src/kernels/matvec.rs.
const ROWS: u32 = 64u;
const SLICES: u32 = {{SLICES}}u;

#if SLICED
// Per-thread partial dot products: .x for `w`, .y for `w_up` (SWIGLU only, else 0).
var<workgroup> partials: array<vec2<f32>, ROWS * SLICES>;
#endif

fn x4(first: u32) -> vec4<f32> {
    return vec4<f32>(x[first], x[first + 1u], x[first + 2u], x[first + 3u]);
}

fn silu(a: f32) -> f32 {
    return a / (1.0 + exp(-a));
}

@compute @workgroup_size(ROWS * SLICES)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let lane = lid % ROWS;
    let slice = lid / ROWS;
    let row = (wg.x + wg.y * nwg.x) * ROWS + lane;
    // Lanes past the last row compute the last row again (their sums are never stored), so the
    // workgroup stays uniform up to the barrier.
    var sums = row_partial(min(row, params.rows - 1u), slice);
#if SLICED
    partials[lid] = sums;
    workgroupBarrier();
    if (slice != 0u) {
        return;
    }
    for (var s = 1u; s < SLICES; s++) {
        sums += partials[lane + s * ROWS];
    }
#endif
    if (row < params.rows) {
        store(row, sums);
    }
}

// This thread's share of the row's dot product(s).
fn row_partial(row: u32, slice: u32) -> vec2<f32> {
    var sums = vec2<f32>(0.0);
    let units = params.cols / 8u;
#if DENSE
    // Dense rows have no blocks (and need not be whole units): unit by unit, then the columns
    // after the last whole unit one by one.
    for (var u = slice; u < units; u += SLICES) {
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
    for (var col = units * 8u + slice; col < params.cols; col += SLICES) {
        sums.x += load_dense(row, col) * x[col];
#if SWIGLU
        sums.y += load_up_dense(row, col) * x[col];
#endif
    }
#else
    for (var first = 4u * slice; first < units; first += 4u * SLICES) {
        let scales = load_scale_words(row, first);
#if SWIGLU
        let up_scales = load_up_scale_words(row, first);
#endif
        for (var u = first; u < first + 4u; u++) {
            let cols = unit_cols(u);
            let xlo = x4(cols.x);
            let xhi = x4(cols.y);
            let gate = load_unit_scaled(row, u, scales);
            sums.x += dot(gate.lo, xlo) + dot(gate.hi, xhi);
#if SWIGLU
            let up = load_up_unit_scaled(row, u, up_scales);
            sums.y += dot(up.lo, xlo) + dot(up.hi, xhi);
#endif
        }
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
