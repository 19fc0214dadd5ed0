// A constrained output's token mask, applied in place to the logits after the penalties and
// before the sampler: every token whose bit is clear in the host's mask (llguidance's layout: bit
// `id % 32` of word `id / 32`) gets `banned` (-inf). The host uploads vocab/32 words a step instead
// of reading the vocabulary's logits back.
//
// One thread per logit; the 32 threads of a word read it together (one broadcast load).
// Bindings: 0 params, 1 mask (read), 2 logits (read_write).

#include "TokenMaskUniform"

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> mask: array<u32>;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let id = gid.x;
    if (id >= params.n_vocab) {
        return;
    }
    if ((mask[id / 32u] & (1u << (id % 32u))) == 0u) {
        logits[id] = params.banned;
    }
}
