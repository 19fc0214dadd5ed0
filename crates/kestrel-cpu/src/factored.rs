//! A K-quant's scales (or offsets) kept as the format keeps them: a small integer per group and
//! one f32 unit per super-block of 256 weights (`kestrel_gguf::quant::super_block_factors`), a
//! byte per group where the whole value took four. The products are exact in f32, so a kernel
//! multiplying integer by unit gets the very f32 the whole value was.

/// Values per unit, and how the values are laid out: `lanes` rows interleaved (8 for the
/// interleaved layouts, 1 for rows one after another). Value `i` of row-interleaved group
/// `i / lanes` takes the unit of its own lane in unit-group `i / lanes / per_unit`. Both counts
/// are powers of two, kept as shifts: a kernel finds a unit per block of weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitLayout {
    unit_shift: u32,
    lane_shift: u32,
}

impl UnitLayout {
    /// Panics unless both counts are powers of two (a K-quant's 8 or 16 groups a super-block;
    /// 1 or 8 lanes).
    pub(crate) fn new(per_unit: usize, lanes: usize) -> Self {
        assert!(per_unit.is_power_of_two() && lanes.is_power_of_two(), "unit layout: {per_unit} values a unit, {lanes} lanes");
        Self { unit_shift: per_unit.trailing_zeros(), lane_shift: lanes.trailing_zeros() }
    }

    pub(crate) fn per_unit(self) -> usize {
        1 << self.unit_shift
    }

    pub(crate) fn lanes(self) -> usize {
        1 << self.lane_shift
    }

    /// Where value `i`'s unit lies.
    #[inline]
    pub(crate) fn unit_of(self, i: usize) -> usize {
        let lane_group = i >> self.lane_shift;
        ((lane_group >> self.unit_shift) << self.lane_shift) | (i & (self.lanes() - 1))
    }
}

/// For the kernels' tests: factored values of `rows` rows of `groups` values, `per_unit` a unit,
/// with integers over i8's whole range and units of both signs: the whole values (rows one after
/// another), and the units and integers interleaved for 8-row groups (`rows` a multiple of 8).
#[cfg(test)]
pub(crate) fn test_factors(rows: usize, groups: usize, per_unit: usize, seed: usize) -> (Vec<f32>, Vec<f32>, Vec<i8>) {
    use crate::interleaved::interleave_values;
    let units: Vec<f32> = (0..rows * groups / per_unit).map(|u| ((u * 7 + seed) % 9) as f32 / 512.0 - 1.0 / 128.0).collect();
    let k: Vec<i8> = (0..rows * groups).map(|i| ((i * 89 + seed * 31) % 256) as u8 as i8).collect();
    let values = k.iter().enumerate().map(|(i, &k)| units[i / per_unit] * f32::from(k)).collect();
    let woven_units = interleave_values(&units, rows, groups / per_unit, false);
    (values, woven_units, interleave_values(&k, rows, groups, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_interleaved_rows() {
        // 8 rows interleaved, 2 values a unit: values 0..8 are group 0 of rows 0..8, 8..16 group 1.
        let woven = UnitLayout::new(2, 8);
        let want: Vec<usize> = (0..8).chain(0..8).chain(8..16).collect();
        assert_eq!((0..24).map(|i| woven.unit_of(i)).collect::<Vec<_>>(), want);
        let plain = UnitLayout::new(4, 1);
        assert_eq!((0..9).map(|i| plain.unit_of(i)).collect::<Vec<_>>(), [0, 0, 0, 0, 1, 1, 1, 1, 2]);
    }
}
