// Plain buffer copy, four words per thread. Its bandwidth is the yardstick the benchmarks
// compare every other kernel against ("fraction of copy bandwidth").

#include "CopyParams"

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < params.n_vec4) {
        dst[i] = src[i];
    }
}
