//! BERT's GELU as ggml's CPU backend computes it (`ggml_vec_gelu_f32` with GGML_GELU_FP16): the
//! input rounded to f16 and looked up in a table of the tanh approximation, itself stored in f16;
//! 0 below -10 and the input itself above 10. A table lookup is also far cheaper than a tanh
//! per activation, which dominated an encoder's time.

use std::sync::OnceLock;

/// `ggml_gelu_f32`: the tanh approximation in f32 arithmetic.
fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// The result for every f16 input, as f32 (the f16 values ggml's table holds, widened once).
fn table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|bits| half::f16::from_f32(gelu_f32(half::f16::from_bits(bits).to_f32())).to_f32()).collect())
}

/// Applies the GELU to every value of `x` in place.
pub fn gelu_in_place(x: &mut [f32]) {
    let table = table();
    for v in x {
        *v = if *v <= -10.0 {
            0.0
        } else if *v >= 10.0 {
            *v
        } else {
            table.get(half::f16::from_f32(*v).to_bits() as usize).copied().unwrap_or(0.0)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_formula_to_f16_precision() {
        let mut xs: Vec<f32> = (-1200..=1200).map(|i| i as f32 / 100.0).collect();
        let exact: Vec<f32> = xs
            .iter()
            .map(|&x| {
                if x <= -10.0 {
                    0.0
                } else if x >= 10.0 {
                    x
                } else {
                    gelu_f32(x)
                }
            })
            .collect();
        gelu_in_place(&mut xs);
        for (got, want) in xs.iter().zip(&exact) {
            // Two f16 roundings (input and output): a few parts in a thousand, plus the slope.
            assert!((got - want).abs() <= 4e-3 * want.abs().max(1.0), "{got} vs {want}");
        }
        let mut edges = [-10.5, -10.0, 10.0, 12.5, 0.0];
        gelu_in_place(&mut edges);
        assert_eq!(edges, [0.0, 0.0, 10.0, 12.5, 0.0]);
    }
}
