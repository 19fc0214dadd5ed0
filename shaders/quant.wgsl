// Decoders of the GPU weight layouts written by `kestrel_gguf::quant::pack_for_gpu`, shared by
// the matvec, matmul and embedding kernels. Exactly one WTYPE_* define selects the type (the
// Rust side also defines DENSE for F32/F16, which have no blocks, no scales and any row length).
//
// A row of K weights is read in "units" of 8 weights. A block of 32 is 4 units and a unit is
// UNIT_WORDS consecutive words of the quant section, so threads that take consecutive units read
// consecutive words. A unit decodes to two vec4s holding the weights at row columns
// unit_cols(u).x .. +3 and unit_cols(u).y .. +3 (not adjacent for Q4: byte j of a Q4 block holds
// elements j and j + 16). A row occupies `row_words` = K * UNIT_WORDS / 8 words.
//
// The including kernel declares `params: WeightParams` and the weight buffer `w: array<u32>`
// (and `w_up` under SWIGLU), which the loaders at the end read.

// Mirrors `WeightParams` in crates/kestrel-gpu/src/kernels/matvec.rs.
struct WeightParams {
    rows: u32,          // N: output features (or vocabulary for the embedding table)
    cols: u32,          // K: input features, contiguous in a row
    row_words: u32,     // quant-section words per row
    scale_offset: u32,  // first word of the scale section
    max_tokens: u32,    // rows the activation buffers hold (matmul, embedding)
    rows_per_group: u32, // consecutive rows one matvec workgroup computes
}

struct Unit {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

#if WTYPE_F32
const UNIT_WORDS: u32 = 8u;
const HAS_SCALES: bool = false;
#endif
#if WTYPE_F16
const UNIT_WORDS: u32 = 4u;
const HAS_SCALES: bool = false;
#endif
#if WTYPE_Q8_0
const UNIT_WORDS: u32 = 2u;
const HAS_SCALES: bool = true;
#endif
#if WTYPE_Q4_0
const UNIT_WORDS: u32 = 1u;
const HAS_SCALES: bool = true;
#endif
#if WTYPE_Q4_1
const UNIT_WORDS: u32 = 1u;
const HAS_SCALES: bool = true;
#endif

// Row columns of the two vec4s of unit `u` (counted from the row start).
fn unit_cols(u: u32) -> vec2<u32> {
#if WTYPE_Q4_0
    let first = (u >> 2u) * 32u + (u & 3u) * 4u;
    return vec2<u32>(first, first + 16u);
#else
#if WTYPE_Q4_1
    let first = (u >> 2u) * 32u + (u & 3u) * 4u;
    return vec2<u32>(first, first + 16u);
#else
    return vec2<u32>(8u * u, 8u * u + 4u);
#endif
#endif
}

// Word of the scale section holding the scale(s) of block `block` (block-quantized types only).
fn scale_word(scale_offset: u32, block: u32) -> u32 {
#if WTYPE_Q4_1
    return scale_offset + block;
#else
    return scale_offset + (block >> 1u);
#endif
}

// (d, m) of block `block` from its scale word: value = q * d + m (m = 0 but for Q4_1).
fn block_scale(word: u32, block: u32) -> vec2<f32> {
    let pair = unpack2x16float(word);
#if WTYPE_Q4_1
    return pair;
#else
    return vec2<f32>(pair[block & 1u], 0.0);
#endif
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

// Dequantizes one unit from its words `q` and its block's (d, m).
fn decode_unit(q: array<u32, UNIT_WORDS>, scale: vec2<f32>) -> Unit {
#if WTYPE_F32
    return Unit(bitcast<vec4<f32>>(vec4<u32>(q[0], q[1], q[2], q[3])),
                bitcast<vec4<f32>>(vec4<u32>(q[4], q[5], q[6], q[7])));
#endif
#if WTYPE_F16
    return Unit(vec4<f32>(unpack2x16float(q[0]), unpack2x16float(q[1])),
                vec4<f32>(unpack2x16float(q[2]), unpack2x16float(q[3])));
#endif
#if WTYPE_Q8_0
    return Unit(int8x4(q[0]) * scale.x, int8x4(q[1]) * scale.x);
#endif
#if WTYPE_Q4_0
    let b = bytes4(q[0]);
    return Unit((vec4<f32>(b & vec4<u32>(15u)) - 8.0) * scale.x, (vec4<f32>(b >> vec4<u32>(4u)) - 8.0) * scale.x);
#endif
#if WTYPE_Q4_1
    let b = bytes4(q[0]);
    return Unit(fma(vec4<f32>(b & vec4<u32>(15u)), vec4<f32>(scale.x), vec4<f32>(scale.y)),
                fma(vec4<f32>(b >> vec4<u32>(4u)), vec4<f32>(scale.x), vec4<f32>(scale.y)));
#endif
}

#if DENSE
// Dense types allow rows that are not a whole number of units; the last few columns are read one
// by one: the word holding column `col` of row `row`, then the value of that column in it.
fn dense_word(row_words: u32, row: u32, col: u32) -> u32 {
    return row * row_words + col * UNIT_WORDS / 8u;
}

fn dense_value(word: u32, col: u32) -> f32 {
#if WTYPE_F32
    return bitcast<f32>(word);
#else
    return unpack2x16float(word)[col & 1u];
#endif
}
#endif

// Weights of unit `u` of row `row` of `w`.
fn load_unit(row: u32, u: u32) -> Unit {
    let first = row * params.row_words + u * UNIT_WORDS;
    var q: array<u32, UNIT_WORDS>;
    for (var i = 0u; i < UNIT_WORDS; i++) {
        q[i] = w[first + i];
    }
    var scale = vec2<f32>(1.0, 0.0);
    if (HAS_SCALES) {
        let block = row * (params.cols / 32u) + u / 4u;
        scale = block_scale(w[scale_word(params.scale_offset, block)], block);
    }
    return decode_unit(q, scale);
}

#if SWIGLU
// `load_unit` for the up projection `w_up` (same type and shape as `w`). A copy because WGSL
// cannot pass a storage buffer to a function.
fn load_up_unit(row: u32, u: u32) -> Unit {
    let first = row * params.row_words + u * UNIT_WORDS;
    var q: array<u32, UNIT_WORDS>;
    for (var i = 0u; i < UNIT_WORDS; i++) {
        q[i] = w_up[first + i];
    }
    var scale = vec2<f32>(1.0, 0.0);
    if (HAS_SCALES) {
        let block = row * (params.cols / 32u) + u / 4u;
        scale = block_scale(w_up[scale_word(params.scale_offset, block)], block);
    }
    return decode_unit(q, scale);
}
#endif

#if DENSE
// Weight at column `col` of row `row` of `w`, for the columns after the last whole unit.
fn load_dense(row: u32, col: u32) -> f32 {
    return dense_value(w[dense_word(params.row_words, row, col)], col);
}

#if SWIGLU
fn load_up_dense(row: u32, col: u32) -> f32 {
    return dense_value(w_up[dense_word(params.row_words, row, col)], col);
}
#endif
#endif
