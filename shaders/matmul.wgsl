// Matrix-matrix product for prefill: y[m][n] = sum_k x[m][k] * W[n][k] for the step's n_tokens
// rows of x (f32, row-major, K per row), W in the GPU weight layout of quant.wgsl.
//
// A workgroup computes a BM x BN tile of y (tokens x output features). For each slice of BK = 32
// columns (one quant block) it stages x[BM][BK] and the dequantized W[BN][BK] in workgroup
// memory; each of its 64 threads then accumulates an 8 x TN register block whose tokens are 8
// apart and whose features are 8 apart, so that neighbouring threads write neighbouring y words.
// The block's size sets the kernel's speed: a step over one quad (4 tile columns) reads 8 + TN
// tile quads shared by the block's 4 * 8 * TN products. A tile of at most 8 tokens skips the
// weight tile and runs as a batched matvec (`few_token_tile`). Every path sums a product in the
// same order.
//
// Epilogues (defines) as in matvec.wgsl: BIAS, ACCUMULATE (in-place y += x W^T; each y element is
// read then written by the same invocation), SWIGLU (gate `w`, up `w_up`; the tile is then only
// 32 features wide so that both weight tiles fit in 16 KiB of workgroup memory).
//
// SHARE_X (subgroups of at least 8 lanes): the 8 threads of a token group, when they are 8
// aligned lanes of one subgroup, read one x quad each per step and exchange them by shuffles, so
// a step reads 1 + TN tile quads instead of 8 + TN (on devices whose workgroup-memory bandwidth
// bounds the product, and on lavapipe where each read is a loop over the lanes); in a few-token
// tile any 8 aligned lanes share the x quads all threads read.
#include "subgroups"
#if SHARE_X
// The shuffles run in loops whose trip counts are the same for the lanes of a token group, which
// are the only lanes a lane reads from; the analysis cannot see that.
diagnostic(off, subgroup_uniformity);
#endif
#include "quant"
#include "activation"
#include "StepParams"

@group(0) @binding(0) var<uniform> params: WeightParams;
@group(0) @binding(1) var<uniform> step: Step;
// Read as vec4s, a quad at a time where rows are whole vec4s (every buffer is a whole number of
// vec4s); value i of the row-major [tokens][K] array is x[i / 4][i % 4].
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<u32>;
#if SWIGLU
@group(0) @binding(5) var<storage, read> w_up: array<u32>;
#endif
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif

const THREADS: u32 = 64u;
const BM: u32 = 64u;
const BK: u32 = 32u;
#if SWIGLU
const BN: u32 = 32u;
#else
const BN: u32 = 64u;
#endif
// Each thread accumulates TM = 8 tokens, 8 apart (two vec4s of accumulators), by TN features,
// 8 apart: a step of the inner loop reads 8 + TN tile quads for 4 * 8 * TN multiply-adds.
const TN: u32 = BN / 8u;

// Tiles hold quads: 4 consecutive tile columns of a row in one vec4, read and written whole (one
// wide access instead of four; on lavapipe each access is a loop over the SIMD lanes, so this
// quarters the loops). Tiles are unpadded (64 x 32 x 2 words fill the 16 KiB of workgroup memory
// WebGPU guarantees); a quad's index is XORed with its row instead, so that threads reading one
// quad column of different rows hit different banks.
const QUADS: u32 = BK / 4u;

fn tile_index(row: u32, quad: u32) -> u32 {
    return row * QUADS + (quad ^ (row % QUADS));
}

// The thread's accumulators. lo[j][i]: token tm + 8i, hi[j][i]: token tm + 32 + 8i, both of
// feature tn + 8j (up_*: the same of the up projection).
var<private> lo: array<vec4<f32>, TN>;
var<private> hi: array<vec4<f32>, TN>;
#if SWIGLU
var<private> up_lo: array<vec4<f32>, TN>;
var<private> up_hi: array<vec4<f32>, TN>;
#endif

var<workgroup> x_tile: array<vec4<f32>, BM * QUADS>;
var<workgroup> w_tile: array<vec4<f32>, BN * QUADS>;
#if SWIGLU
var<workgroup> up_tile: array<vec4<f32>, BN * QUADS>;
#endif

#if DENSE
// Unit `u` of row `n` (of `w_up` when `is_up`) of dense weights. A unit running past K (dense rows
// need not be whole units) is read column by column, zero past K.
fn dense_unit(n: u32, u: u32, is_up: bool) -> Unit {
    if (8u * u + 8u > params.cols) {
        var values: array<f32, 8>;
        for (var e = 0u; e < 8u; e++) {
            let k = 8u * u + e;
            if (k >= params.cols) {
                break;
            }
#if SWIGLU
            if (is_up) {
                values[e] = load_up_dense(n, k);
                continue;
            }
#endif
            values[e] = load_dense(n, k);
        }
        return Unit(
            vec4<f32>(values[0], values[1], values[2], values[3]),
            vec4<f32>(values[4], values[5], values[6], values[7]),
        );
    }
#if SWIGLU
    if (is_up) {
        return load_up_unit(n, u);
    }
#endif
    return load_unit(n, u);
}
#endif

// The scale pairs (block_scales) and plane words of row n's block that starts at unit `first`
// (a slice's 32 columns), loaded once for its 4 units; none for dense rows.
struct SliceBlock {
    scale: vec4<f32>,
    high: vec2<u32>,
}

fn slice_block(n: u32, first: u32, is_up: bool) -> SliceBlock {
#if DENSE
    return SliceBlock(vec4<f32>(), vec2<u32>());
#else
#if SWIGLU
    if (is_up) {
        return SliceBlock(block_scales(load_up_scale_words(n, first), n, first), load_up_block_high(n, first));
    }
#endif
    return SliceBlock(block_scales(load_scale_words(n, first), n, first), load_block_high(n, first));
#endif
}

// Unit `first` + v (v < 4) of row `n` (of `w_up` when `is_up`), given its block's slice_block.
fn block_unit(n: u32, first: u32, v: u32, block: SliceBlock, is_up: bool) -> Unit {
#if DENSE
    return dense_unit(n, first + v, is_up);
#else
    let scale = select(block.scale.xy, block.scale.zw, v >= 2u);
#if SWIGLU
    if (is_up) {
        return load_up_unit_in(n, first + v, scale, block.high);
    }
#endif
    return load_unit_in(n, first + v, scale, block.high);
#endif
}

// The row column, from the slice's start, of tile column `c`. The tiles keep each unit's 8
// weights together (unit v of the slice in columns 8v .. 8v + 7), the order in which the
// few-token path takes them from the weight buffer; every path sums in tile column order.
fn slice_col(c: u32) -> u32 {
    let cols = unit_cols(c / 8u);
    let e = c % 8u;
    return select(cols.y + e - 4u, cols.x + e, e < 4u);
}

// Stages x[m0 .. m0 + rows][k0 .. k0 + BK] in tile column order, the tile's rows that are step
// tokens (the others are never read into a stored result); columns past K are zero.
// A quad's columns are 4 consecutive row columns from a multiple of 4 (unit_cols), so where K is
// a multiple of 4 (every quantized type) a quad is one aligned vec4 of x, whole or past K.
fn load_x_tile(lid: u32, m0: u32, k0: u32, rows: u32) {
    let whole_quads = params.cols % 4u == 0u;
    for (var i = lid; i < rows * QUADS; i += THREADS) {
        let r = i / QUADS;
        let quad = i % QUADS;
        let first = k0 + slice_col(4u * quad);
        let row = (m0 + r) * params.cols;
        var v = vec4<f32>();
        if (whole_quads) {
            if (first < params.cols) {
                v = x[(row + first) / 4u];
            }
        } else {
            for (var e = 0u; e < 4u; e++) {
                if (first + e < params.cols) {
                    let index = row + first + e;
                    v[e] = x[index / 4u][index % 4u];
                }
            }
        }
        x_tile[tile_index(r, quad)] = v;
    }
}

// Stages W[n0 .. n0 + BN][k0 .. k0 + BK] (and the same of `w_up`) dequantized, one unit of 8
// weights per step; features past the last are clamped to it (never stored).
fn load_w_tile(lid: u32, n0: u32, k0: u32) {
    // Thread t stages row t % BN (neighbouring threads read neighbouring words of the tiled
    // weight layout), units t / BN, + THREADS / BN, ... of the slice's block, whose scale and
    // plane words it loads once.
    let r = lid % BN;
    let n = min(n0 + r, params.rows - 1u);
    let first = k0 / 8u;
    let block = slice_block(n, first, false);
#if SWIGLU
    let up_block = slice_block(n, first, true);
#endif
    for (var v = lid / BN; v < 4u; v += THREADS / BN) {
        // Unit v is tile columns 8v .. 8v + 7: quads 2v (lo) and 2v + 1 (hi).
        let unit = block_unit(n, first, v, block, false);
        w_tile[tile_index(r, 2u * v)] = unit.lo;
        w_tile[tile_index(r, 2u * v + 1u)] = unit.hi;
#if SWIGLU
        let up = block_unit(n, first, v, up_block, true);
        up_tile[tile_index(r, 2u * v)] = up.lo;
        up_tile[tile_index(r, 2u * v + 1u)] = up.hi;
#endif
    }
}

// The thread's x values of one quad: element e holds those of tile column 4q + e, for its first
// token (one_token_quad) or for 4 of its tokens (one per component).
alias XQuad = array<vec4<f32>, 4>;

// Products of quad q for the thread's first token, whose x values of the quad's columns are `a`,
// with each of its features.
fn one_token_quad(quad: u32, tn: u32, a: vec4<f32>) {
    for (var j = 0u; j < TN; j++) {
        let b = w_tile[tile_index(tn + 8u * j, quad)];
#if SWIGLU
        let b_up = up_tile[tile_index(tn + 8u * j, quad)];
#endif
        lo[j].x = fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, lo[j].x))));
#if SWIGLU
        up_lo[j].x = fma(a.w, b_up.w, fma(a.z, b_up.z, fma(a.y, b_up.y, fma(a.x, b_up.x, up_lo[j].x))));
#endif
    }
}

// `sums` plus 4 tokens' products with one feature over a quad, column by column in order. Written
// out: arrays indexed in loops that a compiler does not unroll are kept in memory.
fn quad_sum(a: XQuad, b: vec4<f32>, sums: vec4<f32>) -> vec4<f32> {
    let s0 = fma(a[0], vec4<f32>(b.x), sums);
    let s1 = fma(a[1], vec4<f32>(b.y), s0);
    let s2 = fma(a[2], vec4<f32>(b.z), s1);
    return fma(a[3], vec4<f32>(b.w), s2);
}

// Products of quad q for the thread's first 4 tokens (a) with each of its features.
fn lo_quad(quad: u32, tn: u32, a: XQuad) {
    for (var j = 0u; j < TN; j++) {
        let b = w_tile[tile_index(tn + 8u * j, quad)];
#if SWIGLU
        let b_up = up_tile[tile_index(tn + 8u * j, quad)];
#endif
        lo[j] = quad_sum(a, b, lo[j]);
#if SWIGLU
        up_lo[j] = quad_sum(a, b_up, up_lo[j]);
#endif
    }
}

// Products of quad q for all 8 of the thread's tokens (a, a_hi) with each of its features.
fn all_quad(quad: u32, tn: u32, a: XQuad, a_hi: XQuad) {
    for (var j = 0u; j < TN; j++) {
        let b = w_tile[tile_index(tn + 8u * j, quad)];
#if SWIGLU
        let b_up = up_tile[tile_index(tn + 8u * j, quad)];
#endif
        lo[j] = quad_sum(a, b, lo[j]);
        hi[j] = quad_sum(a_hi, b, hi[j]);
#if SWIGLU
        up_lo[j] = quad_sum(a, b_up, up_lo[j]);
        up_hi[j] = quad_sum(a_hi, b_up, up_hi[j]);
#endif
    }
}

// Element e of the result: component e of each of 4 tokens' quads t0 .. t3.
fn transposed(t0: vec4<f32>, t1: vec4<f32>, t2: vec4<f32>, t3: vec4<f32>) -> XQuad {
    return XQuad(
        vec4<f32>(t0.x, t1.x, t2.x, t3.x),
        vec4<f32>(t0.y, t1.y, t2.y, t3.y),
        vec4<f32>(t0.z, t1.z, t2.z, t3.z),
        vec4<f32>(t0.w, t1.w, t2.w, t3.w),
    );
}

// Tokens `first`, `first` + `apart`, + 2 `apart` and + 3 `apart` of the x tile in quad q.
fn x_quad(first: u32, apart: u32, quad: u32) -> XQuad {
    let t0 = x_tile[tile_index(first, quad)];
    let t1 = x_tile[tile_index(first + apart, quad)];
    let t2 = x_tile[tile_index(first + 2u * apart, quad)];
    let t3 = x_tile[tile_index(first + 3u * apart, quad)];
    return transposed(t0, t1, t2, t3);
}

#if SHARE_X
// The quads that lanes `first` .. `first` + 3 read.
fn shuffled(own: vec4<f32>, first: u32) -> XQuad {
    let t0 = subgroupShuffle(own, first);
    let t1 = subgroupShuffle(own, first + 1u);
    let t2 = subgroupShuffle(own, first + 2u);
    let t3 = subgroupShuffle(own, first + 3u);
    return transposed(t0, t1, t2, t3);
}
#endif

// Accumulator i of 8 (tokens 8 apart) of feature j.
fn accumulated(j: u32, i: u32) -> f32 {
#if SWIGLU
    if (i < 4u) {
        return gate_activation(lo[j][i]) * up_lo[j][i];
    }
    return gate_activation(hi[j][i - 4u]) * up_hi[j][i - 4u];
#else
    if (i < 4u) {
        return lo[j][i];
    }
    return hi[j][i - 4u];
#endif
}

// Writes output (token m, feature n) with the epilogue.
fn store_output(m: u32, n: u32, product: f32) {
    let index = m * params.out_stride + params.out_offset + n;
    var value = product;
#if BIAS
    value += bias[n];
#endif
#if ACCUMULATE
    value += y[index];
#endif
    y[index] = value;
}

// Products of tile column c for the few-token path: tokens 0-3 (a) and 4-7 (a_hi) with the
// thread's feature, whose weight is b (and b_up).
fn few_token_step(a: vec4<f32>, a_hi: vec4<f32>, b: f32, b_up: f32) {
    lo[0] = fma(a, vec4<f32>(b), lo[0]);
    hi[0] = fma(a_hi, vec4<f32>(b), hi[0]);
#if SWIGLU
    up_lo[0] = fma(a, vec4<f32>(b_up), up_lo[0]);
    up_hi[0] = fma(a_hi, vec4<f32>(b_up), up_hi[0]);
#endif
}

// A tile of at most 8 tokens (a short prompt, the single token of a cached follow-up) is a
// batched matvec: staging the weights would cost more than their few products, so thread t takes
// feature n0 + t for every token, its units straight from the weight buffer, in tile column
// order as the block path (the same bits). Accumulators: lo[0] tokens 0-3, hi[0] tokens 4-7.
fn few_token_tile(lid: u32, lane: u32, n0: u32, m0: u32, rows: u32) {
    let n = min(n0 + lid, params.rows - 1u);
#if SHARE_X
    // Every thread takes the same x words: lane i of 8 reads token i's and shuffles.
    let group = lane & ~7u;
    let role = lane & 7u;
#endif
    for (var k0 = 0u; k0 < params.cols; k0 += BK) {
        load_x_tile(lid, m0, k0, rows);
        workgroupBarrier();
        // Threads past the tile's BN features (half of them in a SwiGLU tile) have nothing to
        // store: a loop bound rather than a branch, so that SIMD groups of them skip the units.
        let units = select(0u, 4u, lid < BN);
        let first = k0 / 8u;
        let block = slice_block(n, first, false);
#if SWIGLU
        let up_block = slice_block(n, first, true);
#endif
        for (var v = 0u; v < units; v++) {
            let w_unit = block_unit(n, first, v, block, false);
#if SWIGLU
            let up_unit = block_unit(n, first, v, up_block, true);
#endif
            // The unit's columns are quads 2v (its lo weights) and 2v + 1 (hi).
            for (var h = 0u; h < 2u; h++) {
                let quad = 2u * v + h;
#if SHARE_X
                let own = x_tile[tile_index(role, quad)];
                let a = shuffled(own, group);
                let a_hi = shuffled(own, group + 4u);
#else
                let a = x_quad(0u, 1u, quad);
                var a_hi: XQuad;
                if (rows > 4u) {
                    a_hi = x_quad(4u, 1u, quad);
                }
#endif
                let b = select(w_unit.hi, w_unit.lo, h == 0u);
#if SWIGLU
                let b_up = select(up_unit.hi, up_unit.lo, h == 0u);
#else
                let b_up = vec4<f32>();
#endif
                few_token_step(a[0], a_hi[0], b.x, b_up.x);
                few_token_step(a[1], a_hi[1], b.y, b_up.y);
                few_token_step(a[2], a_hi[2], b.z, b_up.z);
                few_token_step(a[3], a_hi[3], b.w, b_up.w);
            }
        }
        workgroupBarrier();
    }
    if (n0 + lid >= params.rows || lid >= BN) {
        return;
    }
    for (var i = 0u; i < rows; i++) {
        store_output(m0 + i, n0 + lid, accumulated(0u, i));
    }
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SHARE_X
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
    let n_tokens = min(step.n_tokens, params.max_tokens);
    // Token tiles vary fastest: the workgroups that read the same weight tile (the larger
    // operand) run together, and a device that splits the grid into ranges (lavapipe's threads)
    // gives each range its share of every token tile, short last ones included.
    let n0 = wg.y * BN;
    let m0 = wg.x * BM;
    if (m0 >= n_tokens || n0 >= params.rows) {
        return;
    }
    let tm = lid / 8u;
    let tn = lid % 8u;
    // In a tile that runs past the step's last token (a short prompt, a prompt's last few
    // tokens), a thread computes only as many of its tokens as it has: 1, up to 4 (`lo`) or all
    // 8, each product in the same order whatever the count (the same bits). The counts are loop
    // bounds, the same for the 8 threads of a `tm`: a divergent branch would run both sides on
    // a SIMD device that masks lanes, while a loop ends when none of its lanes is left.
    let rows = min(n_tokens - m0, BM);
    if (rows <= 8u) {
#if SHARE_X
        few_token_tile(lid, lane, n0, m0, rows);
#else
        few_token_tile(lid, 0u, n0, m0, rows);
#endif
        return;
    }
    let tokens = select(0u, (rows - tm + 7u) / 8u, tm < rows);
    let one_token_steps = select(0u, QUADS, tokens == 1u);
    var lo_steps = select(0u, QUADS, tokens >= 2u && tokens <= 4u);
    var all_steps = select(0u, QUADS, tokens > 4u);
#if SHARE_X
    // Whether this thread's token group is lanes `group` .. `group` + 7 of its subgroup (how a
    // device maps threads to lanes is its own; every lane of such a group finds the same). Its
    // steps then shuffle x instead of reading it.
    let group = lane & ~7u;
    var grouped = true;
    for (var i = 0u; i < 8u; i++) {
        grouped = grouped && subgroupShuffle(tm, group + i) == tm;
    }
    let shared_lo_steps = select(0u, lo_steps, grouped);
    let shared_all_steps = select(0u, all_steps, grouped);
    lo_steps -= shared_lo_steps;
    all_steps -= shared_all_steps;
    let role = lane & 7u;
#endif
    for (var k0 = 0u; k0 < params.cols; k0 += BK) {
        load_x_tile(lid, m0, k0, rows);
        load_w_tile(lid, n0, k0);
        workgroupBarrier();
        for (var quad = 0u; quad < one_token_steps; quad++) {
            one_token_quad(quad, tn, x_tile[tile_index(tm, quad)]);
        }
        for (var quad = 0u; quad < lo_steps; quad++) {
            lo_quad(quad, tn, x_quad(tm, 8u, quad));
        }
        for (var quad = 0u; quad < all_steps; quad++) {
            all_quad(quad, tn, x_quad(tm, 8u, quad), x_quad(tm + 32u, 8u, quad));
        }
#if SHARE_X
        for (var quad = 0u; quad < shared_lo_steps; quad++) {
            // Lanes 4-7 of the group read the same tokens as lanes 0-3.
            let own = x_tile[tile_index(tm + 8u * (role & 3u), quad)];
            lo_quad(quad, tn, shuffled(own, group));
        }
        for (var quad = 0u; quad < shared_all_steps; quad++) {
            let own = x_tile[tile_index(tm + 8u * role, quad)];
            all_quad(quad, tn, shuffled(own, group), shuffled(own, group + 4u));
        }
#endif
        workgroupBarrier();
    }

    for (var i = 0u; i < 8u; i++) {
        let m = m0 + tm + 8u * i;
        for (var j = 0u; j < TN; j++) {
            let n = n0 + tn + 8u * j;
            if (m < n_tokens && n < params.rows) {
                store_output(m, n, accumulated(j, i));
            }
        }
    }
}
