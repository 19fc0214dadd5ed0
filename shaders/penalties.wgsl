// Logit processing before sampling, in place, in llama.cpp's chain order: logit bias, then the
// repetition / frequency / presence penalties of the tokens in the recent window.
//
// The CPU (which knows every generated token) merges the window and the bias list into one
// entry per distinct token id: (id, occurrences in the window, summed bias). One thread per entry,
// so no two threads ever touch the same logit and duplicates are counted exactly.
// Bindings: 0 params, 1 entries (read), 2 logits (read_write).

#include "PenaltyUniform"
#include "PenaltyEntry"

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> entries: array<Entry>;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= params.n_entries) {
        return;
    }
    let entry = entries[e];
    // Ids past the vocabulary come from bad input: ignored, never written.
    if (entry.token >= params.n_vocab) {
        return;
    }
    var l = logits[entry.token] + entry.bias;
    if (entry.count > 0u) {
        // llama.cpp: dividing a negative logit would make it more likely, so it is multiplied.
        l = select(l / params.repeat, l * params.repeat, l <= 0.0);
        l -= f32(entry.count) * params.frequency + params.presence;
    }
    logits[entry.token] = l;
}
