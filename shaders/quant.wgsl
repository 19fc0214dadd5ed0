// Decoders of the GPU weight layouts written by `kestrel_gpu::layout::pack_for_gpu`, shared by
// the matvec, matmul and embedding kernels. Exactly one WTYPE_* define selects the type. The Rust
// side (`weight_defines` in kernels/matvec.rs) adds the type's family: DENSE for F32/F16 (no
// blocks, no scales, any row length), else one SCALES_* define naming the scale layout, and
// PLANES for the bit-plane types Q5_0, Q5_1, Q4_K, Q5_K and Q6_K.
//
// A row of K weights is read in "units" of 8 weights. A block of 32 is 4 units and a unit is
// UNIT_WORDS words of the quant section. A unit decodes to two vec4s holding the weights at row
// columns unit_cols(u).x .. +3 and unit_cols(u).y .. +3 (not adjacent for Q4_0/Q4_1: byte j of
// their blocks holds elements j and j + 16). A row has `row_words` = K * UNIT_WORDS / 8 words.
//
// The quant and plane sections interleave rows in tiles of ROW_TILE (`tiled`): the same word of
// ROW_TILE consecutive rows is ROW_TILE consecutive words, so threads that take consecutive rows
// read consecutive words (coalesced) while reading the same activations.
//
// Bit-plane types split each weight's quant into its low 4 bits, in the quant section in weight
// order (weight i of a unit in bits 4i .. 4i + 3 of its word), and HIGH_BITS more bits in the
// plane section, also in weight order (weight g = row * K + col of the tensor in bits
// (g * HIGH_BITS) % 32 of word plane_offset + g * HIGH_BITS / 32). Their units are therefore 8
// consecutive columns whatever order the GGUF block keeps its elements in, and a matmul slice of
// 32 columns is 4 whole units. A weight is (q - Q_OFFSET) * d + m with (d, m) its unit's scale.
//
// The including kernel declares `params: WeightParams` and the weight buffer `w: array<u32>`
// (and `w_up` under SWIGLU), which the loaders at the end (quant_loaders.wgsl) read.

#include "WeightParams"

struct Unit {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Mirrors `kestrel_gpu::layout::ROW_TILE`.
const ROW_TILE: u32 = 32u;

// Index in a tiled section of word `j` of row `row`, rows of `per_row` words.
fn tiled(row: u32, j: u32, per_row: u32) -> u32 {
    return ((row / ROW_TILE) * per_row + j) * ROW_TILE + row % ROW_TILE;
}

// SCALE_WORDS: scale-section words one unit reads (scale_index, unit_scale); the 4 units of a
// 32-weight block read the same words. SCALE_PER_HALF_BLOCK: units 0-1 and 2-3 of a block have
// different scales (Q6_K scales 16 weights); otherwise a block has one (d, m).
#if SCALES_K
const SCALE_WORDS: u32 = 4u;
const SCALE_PER_HALF_BLOCK: bool = false;
#elif SCALES_Q6K
const SCALE_WORDS: u32 = 2u;
const SCALE_PER_HALF_BLOCK: bool = true;
#else
// DENSE (no scale word is read, but an array needs a length), SCALES_D and SCALES_DM.
const SCALE_WORDS: u32 = 1u;
const SCALE_PER_HALF_BLOCK: bool = false;
#endif

#if WTYPE_F32
const UNIT_WORDS: u32 = 8u;
#elif WTYPE_F16
const UNIT_WORDS: u32 = 4u;
#elif WTYPE_Q8_0
const UNIT_WORDS: u32 = 2u;
#else
// Q4_0, Q4_1 and the bit-plane types: 8 four-bit quants.
const UNIT_WORDS: u32 = 1u;
#endif

#if PLANES
#if WTYPE_Q6_K
const HIGH_BITS: u32 = 2u;
#elif WTYPE_Q4_K
const HIGH_BITS: u32 = 0u;
#else
// Q5_0, Q5_1, Q5_K.
const HIGH_BITS: u32 = 1u;
#endif
// The types with a minimum (SCALES_DM, SCALES_K: weight = q * d + m) store their quants as they
// are; the others (Q5_0, Q6_K: weight = (q - Q_OFFSET) * d) centred, offset by half their range
// of 2^(4 + HIGH_BITS) values: 16 and 32.
#if SCALES_DM
const Q_OFFSET: f32 = 0.0;
#elif SCALES_K
const Q_OFFSET: f32 = 0.0;
#else
const Q_OFFSET: f32 = f32(8u << HIGH_BITS);
#endif
#endif

// Row columns of the two vec4s of unit `u` (counted from the row start).
fn unit_cols(u: u32) -> vec2<u32> {
#if WTYPE_Q4_0
    let first = (u >> 2u) * 32u + (u & 3u) * 4u;
    return vec2<u32>(first, first + 16u);
#elif WTYPE_Q4_1
    let first = (u >> 2u) * 32u + (u & 3u) * 4u;
    return vec2<u32>(first, first + 16u);
#else
    return vec2<u32>(8u * u, 8u * u + 4u);
#endif
}

#if !DENSE
// Number of the block of `size` weights (32, or 256 for a K-quant super-block) that holds unit
// `u` of row `row`; blocks are numbered row-major as in the file.
fn block_of(row: u32, u: u32, size: u32) -> u32 {
    return row * (params.cols / size) + u / (size / 8u);
}

// Index in the weight buffer of scale word `i` (of SCALE_WORDS) of unit `u` of row `row`.
fn scale_index(row: u32, u: u32, i: u32) -> u32 {
#if SCALES_D
    // One f16 d per block, two blocks per word.
    return params.scale_offset + block_of(row, u, 32u) / 2u;
#elif SCALES_DM
    // One word (d, m) per block.
    return params.scale_offset + block_of(row, u, 32u);
#elif SCALES_K
    // 4 words per super-block: d | dmin << 16, then the 12 bytes of packed 6-bit scales/mins.
    return params.scale_offset + 4u * block_of(row, u, 256u) + i;
#elif SCALES_Q6K
    // 9 words per pair of super-blocks: d_a | d_b << 16, then 16 int8 scales of each. Word 0 is
    // the d word, word 1 the one holding the scale of the unit's 16-weight sub-block.
    let sb = block_of(row, u, 256u);
    let pair = params.scale_offset + 9u * (sb / 2u);
    return select(pair + 1u + 4u * (sb & 1u) + (u % 32u) / 8u, pair, i == 0u);
#endif
}

// Byte `k` (0..3) of `word`.
fn byte_of(word: u32, k: u32) -> u32 {
    return extractBits(word, 8u * k, 8u);
}

// (d, m) of unit `u` of row `row` from its scale words `s`: weight = (q - Q_OFFSET) * d + m.
// Products of f16 scales and small integers are exact in f32, so these equal ggml's d1, m1.
fn unit_scale(s: array<u32, SCALE_WORDS>, row: u32, u: u32) -> vec2<f32> {
#if SCALES_D
    return vec2<f32>(unpack2x16float(s[0])[block_of(row, u, 32u) & 1u], 0.0);
#elif SCALES_DM
    return unpack2x16float(s[0]);
#elif SCALES_K
    // ggml's get_scale_min_k4 for sub-block j of the super-block: scales bytes 0..3 hold the
    // scales of sub-blocks 0..3 (low 6 bits) and bytes 4..7 their mins; sub-blocks 4..7 take
    // their low 4 bits from bytes 8..11 and their top 2 bits from the top of bytes 0..7.
    let j = (u / 4u) % 8u;
    let k = j % 4u;
    let a = byte_of(s[1], k);
    let b = byte_of(s[2], k);
    let c = byte_of(s[3], k);
    var sc = a & 63u;
    var mn = b & 63u;
    if (j >= 4u) {
        sc = (c & 15u) | ((a >> 6u) << 4u);
        mn = (c >> 4u) | ((b >> 6u) << 4u);
    }
    let dm = unpack2x16float(s[0]);
    return vec2<f32>(dm.x * f32(sc), -(dm.y * f32(mn)));
#elif SCALES_Q6K
    let d = unpack2x16float(s[0])[block_of(row, u, 256u) & 1u];
    let sc = extractBits(bitcast<i32>(s[1]), 8u * ((u / 2u) % 4u), 8u);
    return vec2<f32>(d * f32(sc), 0.0);
#endif
}

#endif

#if PLANES
// Index in the weight buffer of the plane word holding the high bits of unit `u` of row `row`
// (a row has K / 32 * HIGH_BITS plane words), and the shift of the unit's 8 * HIGH_BITS bits in
// it.
fn high_index(row: u32, u: u32) -> u32 {
    let j = (u / 4u) * HIGH_BITS + (u % 4u) * 8u * HIGH_BITS / 32u;
    return params.plane_offset + tiled(row, j, (params.cols / 32u) * HIGH_BITS);
}

fn high_shift(u: u32) -> u32 {
    return ((u % 4u) * 8u * HIGH_BITS) % 32u;
}
#endif

// The high bits of unit `u`, shifted down, from its block's plane words (`load_block_high`).
fn unit_high(block_high: vec2<u32>, u: u32) -> u32 {
#if PLANES
    if (HIGH_BITS > 1u && u % 4u >= 2u) {
        return block_high.y >> high_shift(u);
    }
    return block_high.x >> high_shift(u);
#else
    return 0u;
#endif
}

// (d, m) of unit `u` from its scale words; (1, 0) for dense types. The same for the 4 units of a
// 32-weight block, except where SCALE_PER_HALF_BLOCK (Q6_K: a scale per 16 weights).
fn unit_scale_of(s: array<u32, SCALE_WORDS>, row: u32, u: u32) -> vec2<f32> {
#if DENSE
    return vec2<f32>(1.0, 0.0);
#else
    return unit_scale(s, row, u);
#endif
}

// (d, m) of the halves of the block starting at unit `first`: units 0-1 in .xy, 2-3 in .zw.
fn block_scales(s: array<u32, SCALE_WORDS>, row: u32, first: u32) -> vec4<f32> {
    let lo = unit_scale_of(s, row, first);
    if (SCALE_PER_HALF_BLOCK) {
        return vec4<f32>(lo, unit_scale_of(s, row, first + 2u));
    }
    return vec4<f32>(lo, lo);
}

// The 4 bytes of `w` as integers 0..255, lowest byte first.
fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// The 4 bytes of `w` as signed int8 values (two's complement), lowest byte first.
fn int8x4(w: u32) -> vec4<f32> {
    let shifted = vec4<i32>(bitcast<i32>(w)) << vec4<u32>(24u, 16u, 8u, 0u);
    return vec4<f32>(shifted >> vec4<u32>(24u));
}

// Dequantizes one unit from its quant words `q`, its high bits `high` (bit-plane types: weight i
// of the unit in bits HIGH_BITS * i, already shifted down) and its (d, m).
fn decode_unit(q: array<u32, UNIT_WORDS>, high: u32, scale: vec2<f32>) -> Unit {
#if WTYPE_F32
    return Unit(bitcast<vec4<f32>>(vec4<u32>(q[0], q[1], q[2], q[3])),
                bitcast<vec4<f32>>(vec4<u32>(q[4], q[5], q[6], q[7])));
#elif WTYPE_F16
    return Unit(vec4<f32>(unpack2x16float(q[0]), unpack2x16float(q[1])),
                vec4<f32>(unpack2x16float(q[2]), unpack2x16float(q[3])));
#elif WTYPE_Q8_0
    return Unit(int8x4(q[0]) * scale.x, int8x4(q[1]) * scale.x);
#elif WTYPE_Q4_0
    let b = bytes4(q[0]);
    return Unit((vec4<f32>(b & vec4<u32>(15u)) - 8.0) * scale.x, (vec4<f32>(b >> vec4<u32>(4u)) - 8.0) * scale.x);
#elif WTYPE_Q4_1
    let b = bytes4(q[0]);
    return Unit(fma(vec4<f32>(b & vec4<u32>(15u)), vec4<f32>(scale.x), vec4<f32>(scale.y)),
                fma(vec4<f32>(b >> vec4<u32>(4u)), vec4<f32>(scale.x), vec4<f32>(scale.y)));
#elif PLANES
    let nibble = vec4<u32>(0u, 4u, 8u, 12u);
    let bit = HIGH_BITS * vec4<u32>(0u, 1u, 2u, 3u);
    let mask = vec4<u32>((1u << HIGH_BITS) - 1u);
    let lo = ((vec4<u32>(q[0]) >> nibble) & vec4<u32>(15u)) | (((vec4<u32>(high) >> bit) & mask) << vec4<u32>(4u));
    let hi = ((vec4<u32>(q[0]) >> (nibble + 16u)) & vec4<u32>(15u))
        | (((vec4<u32>(high) >> (bit + 4u * HIGH_BITS)) & mask) << vec4<u32>(4u));
    // (q - Q_OFFSET) is exact and its product with d too (at most 24 significant bits), so the
    // only rounding is that of + m, as in ggml.
    return Unit(fma(vec4<f32>(lo) - Q_OFFSET, vec4<f32>(scale.x), vec4<f32>(scale.y)),
                fma(vec4<f32>(hi) - Q_OFFSET, vec4<f32>(scale.x), vec4<f32>(scale.y)));
#endif
}

#if DENSE
// Dense types allow rows that are not a whole number of units; the last few columns are read one
// by one: the word holding column `col` of row `row`, then the value of that column in it.
fn dense_word(row_words: u32, row: u32, col: u32) -> u32 {
    return tiled(row, col * UNIT_WORDS / 8u, row_words);
}

fn dense_value(word: u32, col: u32) -> f32 {
#if WTYPE_F32
    return bitcast<f32>(word);
#else
    return unpack2x16float(word)[col & 1u];
#endif
}
#endif

// A 32-weight block's 4 units share their scale words and their plane words, so a kernel that
// reads whole blocks loads those once per block (`load_scale_words`, `load_block_high`) and
// decodes its units with `load_unit_in`; `load_unit` reads one unit on its own. The loaders of the
// up projection `w_up` (same type and shape as `w`) are the same text with `load_up_` names.
#include "quant_loaders" WEIGHTS=w LOAD=load_
#if SWIGLU
#include "quant_loaders" WEIGHTS=w_up LOAD=load_up_
#endif
