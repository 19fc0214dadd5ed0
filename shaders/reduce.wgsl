// Reductions over the WG threads of a workgroup (the includer declares `const WG: u32`, a power
// of two): `workgroup_sum` and `workgroup_max` of one f32 per thread, called by every thread with
// its local_invocation_index; every thread gets the result. Each ends with a barrier, so the
// next reduction may reuse the slots.
//
// Under SUBGROUPS, subgroup operations reduce each subgroup and the per-subgroup results are
// combined through workgroup memory; otherwise a tree in workgroup memory halves the active
// threads each level. An entry point takes the built-ins the reductions need as one parameter,
// `thread: ReduceThread`, and starts with `let lid = reduce_setup(thread);`.
struct ReduceThread {
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
#endif
}

#if SUBGROUPS
// One slot per subgroup; the device's subgroups have at least 4 lanes (see GpuFeatures).
var<workgroup> reduce_slots: array<f32, 64>;
var<private> sg_lane: u32;
var<private> sg_size: u32;
#endif

// Keeps the thread's subgroup lane and size for the reductions; returns its
// local_invocation_index.
fn reduce_setup(thread: ReduceThread) -> u32 {
#if SUBGROUPS
    sg_lane = thread.lane;
    sg_size = thread.size;
#endif
    return thread.lid;
}

#if SUBGROUPS

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        reduce_slots[lid / sg_size] = s;
    }
    workgroupBarrier();
    var r = 0.0;
    for (var i = 0u; i < WG / sg_size; i++) {
        r += reduce_slots[i];
    }
    workgroupBarrier();
    return r;
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
    let s = subgroupMax(v);
    if (sg_lane == 0u) {
        reduce_slots[lid / sg_size] = s;
    }
    workgroupBarrier();
    var r = reduce_slots[0];
    for (var i = 1u; i < WG / sg_size; i++) {
        r = max(r, reduce_slots[i]);
    }
    workgroupBarrier();
    return r;
}
#else
var<workgroup> reduce_slots: array<f32, WG>;

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    reduce_slots[lid] = v;
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if (lid < stride) {
            reduce_slots[lid] += reduce_slots[lid + stride];
        }
    }
    workgroupBarrier();
    let r = reduce_slots[0];
    workgroupBarrier();
    return r;
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
    reduce_slots[lid] = v;
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if (lid < stride) {
            reduce_slots[lid] = max(reduce_slots[lid], reduce_slots[lid + stride]);
        }
    }
    workgroupBarrier();
    let r = reduce_slots[0];
    workgroupBarrier();
    return r;
}
#endif
