// Reductions over the WG threads of a workgroup (the includer declares `const WG: u32`, a power
// of two): `workgroup_sum` and `workgroup_max` of one f32 per thread, called by every thread with
// its local_invocation_index; every thread gets the result. Each ends with a barrier, so the
// next reduction may reuse the slots.
//
// Under SUBGROUPS, subgroup operations reduce each subgroup and the per-subgroup results are
// combined through workgroup memory; the entry point must set `sg_lane` and `sg_size` from its
// subgroup built-ins first. Otherwise a tree in workgroup memory halves the active threads each
// level.
#if SUBGROUPS
// One slot per subgroup; the device's subgroups have at least 4 lanes (see GpuFeatures).
var<workgroup> reduce_slots: array<f32, 64>;
var<private> sg_lane: u32;
var<private> sg_size: u32;

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
