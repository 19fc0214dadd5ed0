// The directive that kernels using subgroup built-ins (under SUBGROUPS) need first: included
// before any declaration. Only browsers (Tint) require it; naga rejects it, so pipeline.rs sets
// WGSL_ENABLE_SUBGROUPS for wasm32 only.
#if SUBGROUPS
#if WGSL_ENABLE_SUBGROUPS
enable subgroups;
#endif
#endif
