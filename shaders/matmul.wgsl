// Matrix-matrix product for prefill: y[m][n] = sum_k x[m][k] * W[n][k] for the step's n_tokens
// rows of x (f32, row-major, K per row), W in the GPU weight layout of quant.wgsl.
//
// A workgroup computes a BM x BN tile of y (tokens x output features). For each slice of BK = 32
// columns (one quant block) it stages x[BM][BK] and the dequantized W[BN][BK] in workgroup
// memory; each of its 128 threads then accumulates a TM x TN register block whose tokens are 8
// apart and whose features are 16 apart, so that neighbouring threads write neighbouring y words.
//
// Epilogues (defines) as in matvec.wgsl: BIAS, ACCUMULATE (in-place y += x W^T; each y element is
// read then written by the same invocation), SWIGLU (gate `w`, up `w_up`; the tile is then only
// 32 features wide so that both weight tiles fit in 16 KiB of workgroup memory).
#include "quant"
#include "activation"
#include "step"

@group(0) @binding(0) var<uniform> params: WeightParams;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<u32>;
#if SWIGLU
@group(0) @binding(5) var<storage, read> w_up: array<u32>;
#endif
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif

const THREADS: u32 = 128u;
const BM: u32 = 32u;
const BK: u32 = 32u;
#if SWIGLU
const BN: u32 = 32u;
#else
const BN: u32 = 64u;
#endif
const TM: u32 = 4u;       // tokens per thread, BM / TM = 8 apart (one vec4 of accumulators)
const TN: u32 = BN / 16u; // features per thread, 16 apart
// Tile rows are padded by one word so that threads reading the same column of different rows
// hit different banks.
const STRIDE: u32 = BK + 1u;

var<workgroup> x_tile: array<f32, BM * STRIDE>;
var<workgroup> w_tile: array<f32, BN * STRIDE>;
#if SWIGLU
var<workgroup> up_tile: array<f32, BN * STRIDE>;
#endif

fn store_unit(tile_row: u32, cols: vec2<u32>, unit: Unit, is_up: bool) {
    for (var i = 0u; i < 4u; i++) {
#if SWIGLU
        if (is_up) {
            up_tile[tile_row * STRIDE + cols.x + i] = unit.lo[i];
            up_tile[tile_row * STRIDE + cols.y + i] = unit.hi[i];
            continue;
        }
#endif
        w_tile[tile_row * STRIDE + cols.x + i] = unit.lo[i];
        w_tile[tile_row * STRIDE + cols.y + i] = unit.hi[i];
    }
}

// Stages x[m0 .. m0 + BM][k0 .. k0 + BK]; tokens past the last are clamped to it (their results
// are never stored), columns past K are zero.
fn load_x_tile(lid: u32, m0: u32, k0: u32, n_tokens: u32) {
    for (var i = lid; i < BM * BK; i += THREADS) {
        let r = i / BK;
        let c = i % BK;
        let m = min(m0 + r, n_tokens - 1u);
        let k = k0 + c;
        var v = 0.0;
        if (k < params.cols) {
            v = x[m * params.cols + k];
        }
        x_tile[r * STRIDE + c] = v;
    }
}

// Stages W[n0 .. n0 + BN][k0 .. k0 + BK] (and the same of `w_up`) dequantized, one unit of 8
// weights per step; features past the last are clamped to it (never stored).
fn load_w_tile(lid: u32, n0: u32, k0: u32) {
    // Neighbouring threads take neighbouring rows of one unit: neighbouring words of the tiled
    // weight layout.
    for (var i = lid; i < BN * 4u; i += THREADS) {
        let r = i % BN;
        let n = min(n0 + r, params.rows - 1u);
        let u = k0 / 8u + i / BN;
#if DENSE
        // A unit running past K (dense rows need not be whole units) is read column by column.
        if (8u * u + 8u > params.cols) {
            for (var e = 0u; e < 8u; e++) {
                let k = 8u * u + e;
                var v = 0.0;
                var v_up = 0.0;
                if (k < params.cols) {
                    v = load_dense(n, k);
#if SWIGLU
                    v_up = load_up_dense(n, k);
#endif
                }
                w_tile[r * STRIDE + k - k0] = v;
#if SWIGLU
                up_tile[r * STRIDE + k - k0] = v_up;
#endif
            }
            continue;
        }
#endif
        let cols = unit_cols(u) - vec2<u32>(k0);
        store_unit(r, cols, load_unit(n, u), false);
#if SWIGLU
        store_unit(r, cols, load_up_unit(n, u), true);
#endif
    }
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n_tokens = min(step.n_tokens, params.max_tokens);
    // Token tiles vary fastest: the workgroups that read the same weight tile (the larger
    // operand) run together, and a device that splits the grid into ranges (lavapipe's threads)
    // gives each range its share of every token tile, short last ones included.
    let n0 = wg.y * BN;
    let m0 = wg.x * BM;
    if (m0 >= n_tokens || n0 >= params.rows) {
        return;
    }
    let tm = lid / 16u;
    let tn = lid % 16u;
    // acc[j][i]: token tm + 8i, feature tn + 16j. The TM = 4 tokens of a feature form one vec4,
    // so the inner loop is TN vector FMAs.
    var acc: array<vec4<f32>, TN>;
#if SWIGLU
    var acc_up: array<vec4<f32>, TN>;
#endif
    // In a tile that runs past the step's last token (a short prompt, a prompt's last few
    // tokens), threads with no step token skip the products and threads with only their first
    // compute that one alone, in the full path's order (the same bits). The counts are loop
    // bounds, the same for the 16 threads of a `tm`.
    let valid = n_tokens - m0;
    let one_token_steps = select(0u, BK, tm < valid && tm + 8u >= valid);
    let all_token_steps = select(0u, BK, tm + 8u < valid);
    for (var k0 = 0u; k0 < params.cols; k0 += BK) {
        load_x_tile(lid, m0, k0, n_tokens);
        load_w_tile(lid, n0, k0);
        workgroupBarrier();
        for (var kk = 0u; kk < one_token_steps; kk++) {
            let a = x_tile[tm * STRIDE + kk];
            for (var j = 0u; j < TN; j++) {
                acc[j].x = fma(a, w_tile[(tn + 16u * j) * STRIDE + kk], acc[j].x);
#if SWIGLU
                acc_up[j].x = fma(a, up_tile[(tn + 16u * j) * STRIDE + kk], acc_up[j].x);
#endif
            }
        }
        for (var kk = 0u; kk < all_token_steps; kk++) {
            let a = vec4<f32>(
                x_tile[tm * STRIDE + kk],
                x_tile[(tm + 8u) * STRIDE + kk],
                x_tile[(tm + 16u) * STRIDE + kk],
                x_tile[(tm + 24u) * STRIDE + kk],
            );
            for (var j = 0u; j < TN; j++) {
                acc[j] = fma(a, vec4<f32>(w_tile[(tn + 16u * j) * STRIDE + kk]), acc[j]);
#if SWIGLU
                acc_up[j] = fma(a, vec4<f32>(up_tile[(tn + 16u * j) * STRIDE + kk]), acc_up[j]);
#endif
            }
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < TM; i++) {
        let m = m0 + tm + 8u * i;
        for (var j = 0u; j < TN; j++) {
            let n = n0 + tn + 16u * j;
            if (m >= n_tokens || n >= params.rows) {
                continue;
            }
            let index = m * params.out_stride + params.out_offset + n;
#if SWIGLU
            var value = gate_activation(acc[j][i]) * acc_up[j][i];
#else
            var value = acc[j][i];
#endif
#if BIAS
            value += bias[n];
#endif
#if ACCUMULATE
            value += y[index];
#endif
            y[index] = value;
        }
    }
}
