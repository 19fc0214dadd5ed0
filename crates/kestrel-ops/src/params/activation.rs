//! The activation of a gated FFN (kestrel-gpu's shaders/activation.wgsl on the GPU).

/// The activation of a gated FFN's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateActivation {
    /// SwiGLU (Llama, Qwen, Phi): `a / (1 + e^-a)`.
    Silu,
    /// GeGLU (Gemma): ggml's tanh approximation `0.5 a (1 + tanh(sqrt(2 / pi) (a + 0.044715 a^3)))`.
    Gelu,
}

impl GateActivation {
    /// The largest slope of the activation (SiLU 1.0998, GELU 1.1289): a bound's error factor.
    pub const MAX_SLOPE: f32 = 1.13;

    pub fn apply(self, a: f32) -> f32 {
        match self {
            Self::Silu => a / (1.0 + (-a).exp()),
            Self::Gelu => {
                let a64 = f64::from(a);
                let u = (2.0 / std::f64::consts::PI).sqrt() * a64 * (1.0 + 0.044715 * a64 * a64);
                (0.5 * a64 * (1.0 + u.tanh())) as f32
            }
        }
    }
}
