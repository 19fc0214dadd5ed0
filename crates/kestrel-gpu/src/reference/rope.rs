//! Rotary position embedding with llama.cpp's definitions (`ggml_rope_ext` with
//! `ext_factor = 0`, i.e. no YaRN extrapolation ramp, and `attn_factor = 1`), rotating all
//! `head_dim` dimensions of each head.
//!
//! Pair `i` (of `head_dim / 2`) of a head at position `p` is rotated by
//! `theta_i = p * freq_scale * base^(-2i / head_dim) / freq_factors[i]`:
//! `(x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)`.

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// ggml `GGML_ROPE_TYPE_NORMAL` (Llama): pair `i` is `(x[2i], x[2i + 1])`.
    Norm,
    /// ggml `GGML_ROPE_TYPE_NEOX` (Qwen2, GPT-NeoX): pair `i` is `(x[i], x[i + head_dim / 2])`.
    Neox,
}

/// The model's rotary parameters (GGUF `rope.freq_base`, `rope.scaling.factor` as
/// `freq_scale = 1 / factor`, and the `rope_freqs.weight` tensor of Llama 3.x).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub mode: RopeMode,
    pub base: f32,
    pub freq_scale: f32,
    /// One divisor per pair (`head_dim / 2` values); `None` means all ones.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeConfig {
    /// Plain RoPE: no frequency scaling, no factors.
    pub fn new(mode: RopeMode, base: f32) -> Self {
        Self { mode, base, freq_scale: 1.0, freq_factors: None }
    }

    /// Angle per position step of pair `i` (radians), in f64 so that the GPU's angle tables and
    /// this reference are exact to well below f32 precision.
    pub fn inv_freq(&self, head_dim: usize, i: usize) -> f64 {
        let factor = self.freq_factors.as_ref().map_or(1.0, |f| f64::from(f[i]));
        f64::from(self.freq_scale) * f64::from(self.base).powf(-2.0 * i as f64 / head_dim as f64) / factor
    }

    /// The two indices within a head that pair `i` rotates.
    pub fn pair(&self, head_dim: usize, i: usize) -> (usize, usize) {
        match self.mode {
            RopeMode::Norm => (2 * i, 2 * i + 1),
            RopeMode::Neox => (i, i + head_dim / 2),
        }
    }
}

/// Rotates `x`, the heads of one token (`[n_heads][head_dim]`), for position `pos`.
///
/// Panics if `head_dim` is odd or does not divide `x.len()`, or if the config's freq factors
/// do not have `head_dim / 2` values (shape bugs of the caller).
pub fn rope(x: &[f32], head_dim: usize, pos: usize, config: &RopeConfig) -> Vec<f32> {
    assert!(head_dim.is_multiple_of(2) && x.len().is_multiple_of(head_dim), "rope: {} values, head_dim {head_dim}", x.len());
    if let Some(f) = &config.freq_factors {
        assert_eq!(f.len(), head_dim / 2, "rope: freq_factors must have head_dim / 2 values");
    }
    let mut out = x.to_vec();
    for head in out.chunks_exact_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let theta = pos as f64 * config.inv_freq(head_dim, i);
            let (sin, cos) = (theta.sin() as f32, theta.cos() as f32);
            let (a, b) = config.pair(head_dim, i);
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
    out
}
