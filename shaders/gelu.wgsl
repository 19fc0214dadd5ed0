// GELU in place over the first step.n_tokens rows of n values: ggml's tanh approximation, the
// GELU define's `gate_activation` (activation.wgsl), one thread per value. BERT's FFN applies it
// to the up projection (with its bias) before the down projection.
#include "StepParams"
#include "activation"

#include "GeluParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < step.n_tokens * params.n) {
        x[i] = gate_activation(x[i]);
    }
}
