//! The rotary embedding's parameters; `reference::rope` states the math they define.

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// ggml `GGML_ROPE_TYPE_NORMAL` (Llama): pair `i` is `(x[2i], x[2i + 1])`.
    Norm,
    /// ggml `GGML_ROPE_TYPE_NEOX` (Qwen2, GPT-NeoX): pair `i` is `(x[i], x[i + head_dim / 2])`.
    Neox,
}

/// The model's rotary parameters (GGUF `rope.freq_base`, `rope.scaling.factor` as
/// `freq_scale = 1 / factor`, the `rope_freqs.weight` tensor of Llama 3.x or Phi-3's long/short
/// factors, YaRN's ramp, and the magnitude scale).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub mode: RopeMode,
    pub base: f32,
    pub freq_scale: f32,
    /// One divisor per pair (`head_dim / 2` values); `None` means all ones.
    pub freq_factors: Option<Vec<f32>>,
    /// YaRN's correction dimensions (ggml's `corr_dims`); `None` without YaRN.
    pub yarn: Option<YarnRamp>,
    /// Multiplies the rotated values (ggml's `mscale`: the attention factor, times YaRN's
    /// magnitude correction).
    pub mscale: f32,
}

/// Where YaRN's ramp goes from extrapolation (pairs below `low`) to interpolation (above
/// `high`), as `ggml_rope_yarn_corr_dims` computes them, with `ext_factor` 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnRamp {
    pub low: f32,
    pub high: f32,
}

impl YarnRamp {
    /// `ggml_rope_yarn_corr_dims(head_dim, n_ctx_orig, base, beta_fast, beta_slow)`, in f32 as
    /// ggml computes it (the floor and ceil make the result a pair of whole numbers).
    pub fn new(head_dim: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> Self {
        let corr_dim = |n_rot: f32| head_dim as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
        Self { low: corr_dim(beta_fast).floor().max(0.0), high: corr_dim(beta_slow).ceil().min(head_dim as f32 - 1.0) }
    }

    /// ggml's `rope_yarn_ramp` for pair `i`: 1 below `low` (extrapolate), 0 above `high`.
    pub fn mix(&self, i: usize) -> f64 {
        let y = (i as f32 - self.low) / (self.high - self.low).max(0.001);
        f64::from(1.0 - y.clamp(0.0, 1.0))
    }
}

impl RopeConfig {
    /// Plain RoPE: no frequency scaling, no factors.
    pub fn new(mode: RopeMode, base: f32) -> Self {
        Self { mode, base, freq_scale: 1.0, freq_factors: None, yarn: None, mscale: 1.0 }
    }

    /// Angle per position step of pair `i` (radians), in f64 so that the GPU's angle tables and
    /// this reference are exact to well below f32 precision.
    pub fn inv_freq(&self, head_dim: usize, i: usize) -> f64 {
        let factor = self.freq_factors.as_ref().map_or(1.0, |f| f64::from(f[i]));
        let extrapolated = f64::from(self.base).powf(-2.0 * i as f64 / head_dim as f64) / factor;
        let mix = self.yarn.map_or(0.0, |ramp| ramp.mix(i));
        extrapolated * (f64::from(self.freq_scale) * (1.0 - mix) + mix)
    }

    /// The two indices within a head that pair `i` rotates.
    pub fn pair(&self, head_dim: usize, i: usize) -> (usize, usize) {
        match self.mode {
            RopeMode::Norm => (2 * i, 2 * i + 1),
            RopeMode::Neox => (i, i + head_dim / 2),
        }
    }
}
