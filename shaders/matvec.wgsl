// Matrix-vector product for decode: y[b][n] = sum_k W[n][k] * x[b][k] for the COLUMNS tokens of a
// step (1 for one sequence's decode, B for a batch of sequences each decoding one token), with W
// in the GPU weight layout of quant.wgsl. Each weight is loaded and decoded once for all COLUMNS
// tokens, and every token's sum is accumulated in the order of the one-token kernel, so a token
// gets the same result whatever batch it runs in.
//
// A workgroup computes LANES * R rows: each lane R rows, LANES apart, and SLICES threads share a
// row, each taking every SLICES-th 32-weight block of it. In the tiled weight layout the lanes of
// a slice read consecutive words of consecutive rows (coalesced), while all of them read the same
// activations at the same time: x is loaded as vec4s once for the thread's R rows, and is the
// same for every lane (a broadcast on a GPU, a scalar load on a CPU-emulated one). A block's
// scale and plane words are loaded once for its 4 units of 8 weights (K-quant scales once per
// super-block). With SLICES = 1 (adapters with few, wide cores) there is no reduction and no
// barrier at all; with more slices (GPUs, which need many threads in flight) one barrier hands
// the slices' partial sums to slice 0. The host picks SLICES and R per adapter.
//
// Epilogues (defines): BIAS adds bias[n]; ACCUMULATE adds the old y[n] (the in-place residual
// add, y += W x: each y[n] is read then written by the same invocation); SWIGLU computes
// y[n] = act(Wg[n] . x) * (Wu[n] . x) with the gate in `w` and the up projection in `w_up`
// (act: SiLU, or GELU with the GELU define; shaders/activation.wgsl).
#include "quant"
#include "activation"

@group(0) @binding(0) var<uniform> params: WeightParams;
// Read as vec4s: one load per 4 activations (every buffer is a whole number of vec4s). Token b's
// row starts at value b * cols (cols a multiple of 4 when COLUMNS > 1); its outputs go to
// y[b * out_stride + out_offset + n].
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
#if SWIGLU
@group(0) @binding(4) var<storage, read> w_up: array<u32>;
#endif
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;
#endif

// Mirror `MATVEC_LANES`, `MATVEC_ROWS_PER_THREAD` and the slice count in
// crates/kestrel-gpu/src/kernels/matvec.rs.
const LANES: u32 = 64u;
const R: u32 = {{ROWS_PER_THREAD}}u;
const SLICES: u32 = {{SLICES}}u;
const COLUMNS: u32 = {{COLUMNS}}u;

#if SLICED
// Per-thread partial dot products of its R rows for one token: .x for `w`, .y for `w_up` (SWIGLU
// only). The tokens take turns (16 KiB of workgroup memory would not hold them all).
var<workgroup> partials: array<array<vec2<f32>, R>, LANES * SLICES>;
#endif

// Token b's x[first .. first + 4], `first` a multiple of 4 (unit_cols are).
fn x4(b: u32, first: u32) -> vec4<f32> {
    return x[b * (params.cols / 4u) + first / 4u];
}

// A token's activations of one unit of 8, loaded once for the thread's R rows.
struct XUnit {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

#if BATCHED
// The thread's partial sums of its R rows for every token (.x for `w`, .y for `w_up`), and every
// token's activations of one unit.
alias Sums = array<array<vec2<f32>, R>, COLUMNS>;
alias Xs = array<XUnit, COLUMNS>;

fn token_sums(sums: Sums, b: u32) -> array<vec2<f32>, R> {
    return sums[b];
}

// Every token's activations of the unit of 8 at `cols` (unit_cols).
fn x_units(cols: vec2<u32>) -> Xs {
    var units: Xs;
    for (var b = 0u; b < COLUMNS; b++) {
        units[b] = XUnit(x4(b, cols.x), x4(b, cols.y));
    }
    return units;
}

// Adds one unit of row i's weights times each token's activations to component `c` of its sums.
fn add_unit(sums: ptr<function, Sums>, i: u32, xs: Xs, weights: Unit, c: u32) {
    for (var b = 0u; b < COLUMNS; b++) {
        (*sums)[b][i][c] += dot(weights.lo, xs[b].lo) + dot(weights.hi, xs[b].hi);
    }
}

// Adds `v` to the first token's sums of row i (dense rows' last columns, one token only).
fn add_to_first(sums: ptr<function, Sums>, i: u32, v: vec2<f32>) {
    (*sums)[0][i] += v;
}
#else
// One token: its sums and activations outside arrays of tokens, which not every compiler keeps
// in registers (they made the one-token kernel 1.7x slower on lavapipe).
alias Sums = array<vec2<f32>, R>;
alias Xs = XUnit;

fn token_sums(sums: Sums, b: u32) -> array<vec2<f32>, R> {
    return sums;
}

fn x_units(cols: vec2<u32>) -> Xs {
    return XUnit(x4(0u, cols.x), x4(0u, cols.y));
}

fn add_unit(sums: ptr<function, Sums>, i: u32, xs: Xs, weights: Unit, c: u32) {
    (*sums)[i][c] += dot(weights.lo, xs.lo) + dot(weights.hi, xs.hi);
}

fn add_to_first(sums: ptr<function, Sums>, i: u32, v: vec2<f32>) {
    (*sums)[i] += v;
}
#endif

@compute @workgroup_size(LANES * SLICES)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
#if SLICED
    let lane = lid % LANES;
    let slice = lid / LANES;
#else
    // A constant, so that the compiler sees the activation addresses as workgroup-uniform.
    let lane = lid;
    let slice = 0u;
#endif
    // The thread's rows are LANES apart, so each of its loads is coalesced with its neighbours'.
    // Rows past the last compute the last row again (their sums are never stored): the loops over
    // R stay constant (unrolled, in registers) and the workgroup uniform up to the barrier.
    let first_row = (wg.x + wg.y * nwg.x) * LANES * R + lane;
    var rows: array<u32, R>;
    for (var i = 0u; i < R; i++) {
        rows[i] = min(first_row + i * LANES, params.rows - 1u);
    }
    let sums = row_partials(rows, slice);
    for (var b = 0u; b < COLUMNS; b++) {
        var token = token_sums(sums, b);
#if SLICED
        // The tokens take turns in `partials`: the previous one's must have been read.
        if (b > 0u) {
            workgroupBarrier();
        }
        partials[lid] = token;
        workgroupBarrier();
#endif
        // Slice 0 adds the other slices' partials and stores. No early exit for the others: every
        // thread must reach the next token's barrier in uniform control flow.
        if (slice == 0u) {
#if SLICED
            for (var s = 1u; s < SLICES; s++) {
                for (var i = 0u; i < R; i++) {
                    token[i] += partials[lane + s * LANES][i];
                }
            }
#endif
            for (var i = 0u; i < R; i++) {
                let row = first_row + i * LANES;
                if (row < params.rows) {
                    store(b, row, token[i]);
                }
            }
        }
    }
}

// This thread's share of the dot product(s) of each of its rows for every token: each weight
// unit is decoded once for all COLUMNS tokens, each token's x once for all R rows.
fn row_partials(rows: array<u32, R>, slice: u32) -> Sums {
    var sums: Sums;
    let units = params.cols / 8u;
#if DENSE
    // Dense rows have no blocks (and need not be whole units): unit by unit, then the columns
    // after the last whole unit one by one.
    for (var u = slice; u < units; u += SLICES) {
        let xs = x_units(unit_cols(u));
        for (var i = 0u; i < R; i++) {
            add_unit(&sums, i, xs, load_unit(rows[i], u), 0u);
#if SWIGLU
            add_unit(&sums, i, xs, load_up_unit(rows[i], u), 1u);
#endif
        }
    }
    // (Only one token here: the host refuses COLUMNS > 1 for rows that are not whole vec4s.)
    for (var col = units * 8u + slice; col < params.cols; col += SLICES) {
        let xc = x[col / 4u][col % 4u];
        for (var i = 0u; i < R; i++) {
#if SWIGLU
            add_to_first(&sums, i, vec2<f32>(load_dense(rows[i], col), load_up_dense(rows[i], col)) * xc);
#else
            add_to_first(&sums, i, vec2<f32>(load_dense(rows[i], col) * xc, 0.0));
#endif
        }
    }
#else
    // Q4_K and Q5_K keep one set of scale words per super-block of 32 units: loaded once per
    // super-block (each slice reaches a new one at the same step, so the test is uniform).
    var scales: array<array<u32, SCALE_WORDS>, R>;
#if SWIGLU
    var up_scales: array<array<u32, SCALE_WORDS>, R>;
#endif
    var scales_of = 0xffffffffu;
    for (var first = 4u * slice; first < units; first += 4u * SLICES) {
#if SCALES_K
        let scale_group = first / 32u;
#else
        let scale_group = first;
#endif
        if (scale_group != scales_of) {
            scales_of = scale_group;
            for (var i = 0u; i < R; i++) {
                scales[i] = load_scale_words(rows[i], first);
#if SWIGLU
                up_scales[i] = load_up_scale_words(rows[i], first);
#endif
            }
        }
        // The block's plane words, and its (d, m) decoded once: one per half block (.xy for
        // units 0-1, .zw for 2-3), the same unless the type scales 16 weights (Q6_K).
        var high: array<vec2<u32>, R>;
        var scale: array<vec4<f32>, R>;
#if SWIGLU
        var up_high: array<vec2<u32>, R>;
        var up_scale: array<vec4<f32>, R>;
#endif
        for (var i = 0u; i < R; i++) {
            high[i] = load_block_high(rows[i], first);
            scale[i] = block_scales(scales[i], rows[i], first);
#if SWIGLU
            up_high[i] = load_up_block_high(rows[i], first);
            up_scale[i] = block_scales(up_scales[i], rows[i], first);
#endif
        }
        for (var k = 0u; k < 4u; k++) {
            let u = first + k;
            let xs = x_units(unit_cols(u));
            for (var i = 0u; i < R; i++) {
                add_unit(&sums, i, xs, load_unit_in(rows[i], u, select(scale[i].xy, scale[i].zw, k >= 2u), high[i]), 0u);
#if SWIGLU
                add_unit(&sums, i, xs, load_up_unit_in(rows[i], u, select(up_scale[i].xy, up_scale[i].zw, k >= 2u), up_high[i]), 1u);
#endif
            }
        }
    }
#endif
    return sums;
}

fn store(b: u32, row: u32, total: vec2<f32>) {
#if SWIGLU
    var value = gate_activation(total.x) * total.y;
#else
    var value = total.x;
#endif
#if BIAS
    value += bias[row];
#endif
#if SOFTCAP
    value = soft_cap(value, {{SOFTCAP}});
#endif
    let index = b * params.out_stride + params.out_offset + row;
#if ACCUMULATE
    value += y[index];
#endif
    y[index] = value;
}
