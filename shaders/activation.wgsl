// Activations of the fused kernels. The gate activation of a gated FFN, applied by the fused
// gate/up products (matvec, matmul):
// GELU (GeGLU, Gemma) with the GELU define, else SiLU (SwiGLU, Llama). GELU is ggml's tanh
// approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), written as
// x / (1 + e^(-2u)): the same function, with no tanh of a large argument (which a driver may
// compute as inf / inf).
#if GELU
fn gate_activation(a: f32) -> f32 {
    let u = 0.7978845608028654 * a * (1.0 + 0.044715 * a * a);
    return a / (1.0 + exp(-2.0 * u));
}
#else
fn gate_activation(a: f32) -> f32 {
    return a / (1.0 + exp(-a));
}
#endif

// Gemma's soft cap, cap * tanh(v / cap): of attention scores (Gemma 2: 50) and of the final logits
// (30). tanh(10) is 1 in f32, so clamping there changes nothing and keeps the builtin's argument
// small.
fn soft_cap(v: f32, cap: f32) -> f32 {
    return cap * tanh(clamp(v / cap, -10.0, 10.0));
}
