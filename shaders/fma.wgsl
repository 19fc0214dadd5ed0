// Arithmetic-bound work: CHAINS independent chains of vec4 multiply-adds per thread, on registers
// only. Its rate is the yardstick the benchmarks compare the matrix products against ("fraction
// of FMA peak"), as copy.wgsl's bandwidth is for memory. Independent chains hide the FMA
// latency; the values start from the thread index and a uniform, so the compiler can fold
// nothing, and each thread writes its sum, so it can drop nothing.

#include "FmaParams"

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

const CHAINS: u32 = 8u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= arrayLength(&out)) {
        return;
    }
    let m = vec4<f32>(params.scale);
    let c = vec4<f32>(params.shift);
    var a: array<vec4<f32>, CHAINS>;
    for (var j = 0u; j < CHAINS; j++) {
        a[j] = vec4<f32>(f32(i % 1024u), f32(j), 1.0, -1.0) * 1e-3;
    }
    for (var it = 0u; it < params.iterations; it++) {
        for (var j = 0u; j < CHAINS; j++) {
            a[j] = fma(a[j], m, c);
        }
    }
    var sum = vec4<f32>(0.0);
    for (var j = 0u; j < CHAINS; j++) {
        sum += a[j];
    }
    out[i] = dot(sum, vec4<f32>(1.0));
}
