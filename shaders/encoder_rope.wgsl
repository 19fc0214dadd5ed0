// An encoder's NeoX RoPE (nomic-bert), in place on the Q and K heads of the fused QKV rows of
// the step's n_tokens tokens. Inputs are packed: token t belongs to the input whose tokens are
// spans[t] = [start, end), and sits at position t - start (positions restart at 0 per input).
// Pair i of a head is (x[i], x[i + HD/2]), rotated by the angle whose (cos, sin) is
// `table[pos * HD/2 + i]`, computed on the host in f64 (kernels::encoder::rope_table): no f32
// angle product.
// One thread per pair of each Q and K head.
#include "StepParams"

#include "EncoderRopeParams"

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read> spans: array<vec2<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half_dim = params.head_dim / 2u;
    // Pairs of one token: Q's heads, then K's.
    let per_token = 2u * params.n_heads * half_dim;
    let item = gid.x + gid.y * nwg.x * 256u;
    let t = item / per_token;
    if (t >= step.n_tokens) {
        return;
    }
    let r = item % per_token;
    let head = r / half_dim;
    let i = r % half_dim;
    // Q's heads start at 0, K's at k_offset.
    let part = head / params.n_heads;
    let base = t * params.stride + part * params.k_offset + (head % params.n_heads) * params.head_dim + i;
    let pos = t - spans[t].x;
    let cs = table[pos * half_dim + i];
    let x0 = qkv[base];
    let x1 = qkv[base + half_dim];
    qkv[base] = x0 * cs.x - x1 * cs.y;
    qkv[base + half_dim] = x0 * cs.y + x1 * cs.x;
}
