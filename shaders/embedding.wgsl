// Embedding gather: out[t][:] = dequantized row ids[t] of the table `w` (rows = vocabulary,
// cols = hidden size) for the step's n_tokens ids. One workgroup per token, its threads striding
// over the row in units of 8 weights. A table too large for one binding is split into row shards
// (`first_row`, `total_rows`), one dispatch each, and each writes only the ids in its rows. An id
// past the vocabulary yields a row of zeros, written by the first shard (the model validates ids
// before; this only keeps a bad id from reading out of bounds). Rows are multiplied by SCALE
// (Gemma's sqrt(hidden); 1 elsewhere, which is exact).
#include "quant"
#include "StepParams"

@group(0) @binding(0) var<uniform> params: WeightParams;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> embeddings: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<u32>;

const WG: u32 = 64u;
const SCALE: f32 = {{SCALE}};

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= min(step.n_tokens, params.max_tokens)) {
        return;
    }
    let id = ids[t];
    let valid = id >= params.first_row && id - params.first_row < params.rows;
    let beyond_table = id >= params.total_rows && params.first_row == 0u;
    if (!valid && !beyond_table) {
        return;
    }
    let row = select(0u, id - params.first_row, valid);
    let out_row = t * params.cols;
    let units = params.cols / 8u;
    for (var u = lid; u < units; u += WG) {
        var unit = Unit(vec4<f32>(0.0), vec4<f32>(0.0));
        if (valid) {
            unit = load_unit(row, u);
        }
        let cols = unit_cols(u);
        for (var i = 0u; i < 4u; i++) {
            embeddings[out_row + cols.x + i] = unit.lo[i] * SCALE;
            embeddings[out_row + cols.y + i] = unit.hi[i] * SCALE;
        }
    }
#if DENSE
    // The columns after the last whole unit (fewer than 8), one per thread.
    let col = units * 8u + lid;
    if (col < params.cols) {
        embeddings[out_row + col] = select(0.0, load_dense(row, col), valid) * SCALE;
    }
#endif
}
