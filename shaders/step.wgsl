// Per-step values, shared by all kernels that depend on the position in the sequence.
// Mirrors `StepParams` in crates/kestrel-gpu/src/step.rs. Include it and bind it as
// `var<uniform> step: Step` at the binding the kernel's Rust side documents.
struct Step {
    n_tokens: u32,
    pos: u32,
    kv_len: u32,
    draw: u32,
}
