//! Tensor descriptors and the checks that make their sizes trustworthy.

use crate::error::GgufError;
use crate::types::GgmlType;

/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous dimension (row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Product of the dims. Exact for every tensor that passed `checked_n_bytes` (all parsed
    /// ones); saturates instead of overflowing on hand-built descriptors.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Size of the data in bytes; same exactness rule as `n_elements`.
    pub fn n_bytes(&self) -> u64 {
        self.checked_n_bytes().unwrap_or(u64::MAX)
    }

    /// Rows of `dims[0]` elements: the product of the other dims.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Validates the shape against the type and returns the data size: the row length must be
    /// a whole number of blocks and the size must fit in an i64 (as ggml requires).
    pub fn checked_n_bytes(&self) -> Result<u64, GgufError> {
        let bad = |reason: String| GgufError::BadShape { name: self.name.clone(), dims: self.dims.clone(), reason };
        let row_len = self.dims.first().copied().unwrap_or(1);
        let ty = self.ggml_type;
        if !row_len.is_multiple_of(ty.block_size()) {
            return Err(bad(format!("row length {row_len} is not a multiple of {ty}'s block size {}", ty.block_size())));
        }
        let overflow = || bad("element count or byte size overflows".to_string());
        // The element count must fit too, even though the byte size is what is stored.
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).filter(|&n| n <= i64::MAX as u64).ok_or_else(overflow)?;
        ty.row_bytes(row_len).and_then(|row| row.checked_mul(self.n_rows_checked()?)).filter(|&n| n <= i64::MAX as u64).ok_or_else(overflow)
    }

    fn n_rows_checked(&self) -> Option<u64> {
        self.dims.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}
