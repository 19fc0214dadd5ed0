//! ggml tensor types: ids, names and block geometry, as in ggml.h's `enum ggml_type` and
//! ggml.c's `type_traits` table (ids 4, 5, 31-33, 36-38 were removed upstream and stay unused).

use std::fmt;

#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, ggml id, name, elements per block, bytes per block).
const TABLE: [(GgmlType, u32, &str, u64, u64); 32] = {
    use GgmlType::*;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 18),
        (Q4_1, 3, "Q4_1", 32, 20),
        (Q5_0, 6, "Q5_0", 32, 22),
        (Q5_1, 7, "Q5_1", 32, 24),
        (Q8_0, 8, "Q8_0", 32, 34),
        (Q8_1, 9, "Q8_1", 32, 40),
        (Q2_K, 10, "Q2_K", 256, 84),
        (Q3_K, 11, "Q3_K", 256, 110),
        (Q4_K, 12, "Q4_K", 256, 144),
        (Q5_K, 13, "Q5_K", 256, 176),
        (Q6_K, 14, "Q6_K", 256, 210),
        (Q8_K, 15, "Q8_K", 256, 292),
        (IQ2_XXS, 16, "IQ2_XXS", 256, 66),
        (IQ2_XS, 17, "IQ2_XS", 256, 74),
        (IQ3_XXS, 18, "IQ3_XXS", 256, 98),
        (IQ1_S, 19, "IQ1_S", 256, 50),
        (IQ4_NL, 20, "IQ4_NL", 32, 18),
        (IQ3_S, 21, "IQ3_S", 256, 110),
        (IQ2_S, 22, "IQ2_S", 256, 82),
        (IQ4_XS, 23, "IQ4_XS", 256, 136),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", 256, 56),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", 256, 54),
        (TQ2_0, 35, "TQ2_0", 256, 66),
        (MXFP4, 39, "MXFP4", 32, 17),
    ]
};

impl GgmlType {
    /// Every type, in ggml id order.
    pub const ALL: [GgmlType; 32] = {
        let mut all = [GgmlType::F32; 32];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn entry(self) -> (GgmlType, u32, &'static str, u64, u64) {
        // The enum's declaration order is the table's order.
        TABLE[self as usize]
    }

    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    pub fn id(self) -> u32 {
        self.entry().1
    }

    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_size(self) -> u64 {
        self.entry().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.entry().4
    }

    /// Bytes of a row of `n` elements; `None` if `n` is not a multiple of the block size or
    /// the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_order_matches_enum_and_ids_round_trip() {
        for (i, ty) in GgmlType::ALL.iter().enumerate() {
            assert_eq!(*ty as usize, i);
            assert_eq!(GgmlType::from_id(ty.id()), Some(*ty));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(40), None);
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
    }
}
