// The weight loaders of quant.wgsl for one weight buffer, included once per buffer:
// `#include "quant_loaders" WEIGHTS=w LOAD=load_` defines load_scale_words, load_block_high,
// load_unit_in, load_unit (and load_dense for dense types) reading `w`. A text instantiated per
// buffer because WGSL cannot pass a storage buffer to a function.

// The scale words of unit `u` of row `row` (none for dense types).
fn {{LOAD}}scale_words(row: u32, u: u32) -> array<u32, SCALE_WORDS> {
    var s: array<u32, SCALE_WORDS>;
#if !DENSE
    for (var i = 0u; i < SCALE_WORDS; i++) {
        s[i] = {{WEIGHTS}}[scale_index(row, u, i)];
    }
#endif
    return s;
}

// The plane words of the block of unit `u` of row `row`: HIGH_BITS words (units 0-1 and 2-3 of
// the block when HIGH_BITS is 2); zeros for types without a plane.
fn {{LOAD}}block_high(row: u32, u: u32) -> vec2<u32> {
    var high = vec2<u32>(0u);
#if PLANES
    let first = u - u % 4u;
    if (HIGH_BITS > 0u) {
        high.x = {{WEIGHTS}}[high_index(row, first)];
    }
    if (HIGH_BITS > 1u) {
        high.y = {{WEIGHTS}}[high_index(row, first + 2u)];
    }
#endif
    return high;
}

// Weights of unit `u` of row `row`, given its (d, m) (`unit_scale_of`) and its block's plane
// words.
fn {{LOAD}}unit_in(row: u32, u: u32, scale: vec2<f32>, block_high: vec2<u32>) -> Unit {
    var q: array<u32, UNIT_WORDS>;
    for (var i = 0u; i < UNIT_WORDS; i++) {
        q[i] = {{WEIGHTS}}[tiled(row, u * UNIT_WORDS + i, params.row_words)];
    }
    return decode_unit(q, unit_high(block_high, u), scale);
}

// Weights of unit `u` of row `row`.
fn {{LOAD}}unit(row: u32, u: u32) -> Unit {
    return {{LOAD}}unit_in(row, u, unit_scale_of({{LOAD}}scale_words(row, u), row, u), {{LOAD}}block_high(row, u));
}

#if DENSE
// Weight at column `col` of row `row`, for the columns after the last whole unit.
fn {{LOAD}}dense(row: u32, col: u32) -> f32 {
    return dense_value({{WEIGHTS}}[dense_word(params.row_words, row, col)], col);
}
#endif
