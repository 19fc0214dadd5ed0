//! Weight matrices larger than one storage binding may be, split by rows into buffers that fit.
//! A large vocabulary's embedding table, which is also the LM head when tied, is the case that
//! happens: Llama 3's 128256 x 2048 is 215 MB in Q6_K and 266 MB in Q8_0, over the 128 MiB that
//! WebGPU guarantees and that lavapipe and many mobile GPUs allow. Each shard is a whole
//! `WeightTensor`; products over it write their own output columns (`OutputColumns`) and the
//! embedding gather reads the ids in its row range.

use kestrel_gguf::GgmlType;

use crate::{layout, Gpu, GpuError, WeightTensor};

/// One shard: rows `first_row .. first_row + weight.rows` of the whole matrix.
pub struct RowShard {
    pub first_row: usize,
    pub weight: WeightTensor,
}

/// A `rows` x `cols` weight matrix as one or more row shards, each within the device's
/// storage binding limit.
pub struct RowShards {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub shards: Vec<RowShard>,
}

impl RowShards {
    /// Repacks and uploads GGUF block bytes of a `rows` x `cols` matrix, in as few shards as the
    /// device's binding limit allows (one where the whole matrix fits).
    pub fn from_gguf_bytes(gpu: &Gpu, label: &str, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, GpuError> {
        if rows == 0 || cols == 0 {
            return Err(GpuError::InvalidArgs(format!("{label}: empty weight matrix {rows} x {cols}")));
        }
        let rows_per_shard = rows_per_shard(ty, rows, cols, gpu.max_binding_size(), label)?;
        let row_bytes = ty
            .row_bytes(cols as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| GpuError::InvalidArgs(format!("{label}: a row of {cols} {ty} weights is not whole blocks")))?;
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(GpuError::InvalidArgs(format!("{label}: {} bytes for {rows} rows of {row_bytes} bytes", bytes.len())));
        }
        let mut shards = Vec::with_capacity(rows.div_ceil(rows_per_shard));
        for (i, chunk) in bytes.chunks(rows_per_shard * row_bytes).enumerate() {
            let shard_rows = chunk.len() / row_bytes;
            let shard_label = if rows_per_shard < rows { format!("{label}[{i}]") } else { label.to_string() };
            let weight = WeightTensor::from_gguf_bytes(gpu, &shard_label, ty, shard_rows, cols, chunk)?;
            shards.push(RowShard { first_row: i * rows_per_shard, weight });
        }
        Ok(Self { ty, rows, cols, shards })
    }

    /// Bytes of all shards on the GPU.
    pub fn byte_size(&self) -> u64 {
        self.shards.iter().map(|s| s.weight.byte_size()).sum()
    }
}

/// The most rows of a `cols`-wide `ty` matrix whose packed form fits in `limit` bytes, in whole
/// tiles of `layout::ROW_TILE` rows (all of them when the whole matrix fits).
fn rows_per_shard(ty: GgmlType, rows: usize, cols: usize, limit: u64, label: &str) -> Result<usize, GpuError> {
    let packed_bytes = |r: usize| -> Result<u64, GpuError> { Ok(4 * layout::gpu_sections(ty, r as u64, cols as u64)?.total()) };
    let whole = packed_bytes(rows)?;
    if whole <= limit {
        return Ok(rows);
    }
    // Sections round up to whole words (and scale pairs), so a proportional first guess may be a
    // few rows over; step down from it.
    let mut r = usize::try_from(u128::from(limit) * rows as u128 / u128::from(whole)).unwrap_or(rows).min(rows);
    while r > 0 && packed_bytes(r)? > limit {
        r -= 1;
    }
    if r == 0 {
        return Err(GpuError::Limit { what: format!("{label}: one row of {cols} {ty} weights"), needed: packed_bytes(1)?, limit });
    }
    // Whole tiles of the interleaved layout: a shard of a partial tile holds padding rows.
    let tile = layout::ROW_TILE as usize;
    Ok(if r >= tile { r / tile * tile } else { r })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_fill_the_limit_and_no_more() {
        // 49152 x 576 Q4_1: 20 bytes per 32 weights, 360 bytes per row, 17.7 MB in all.
        let (rows, cols) = (49152, 576);
        let limit = 8 << 20;
        let r = rows_per_shard(GgmlType::Q4_1, rows, cols, limit, "t").unwrap();
        let bytes = |r: usize| 4 * layout::gpu_sections(GgmlType::Q4_1, r as u64, cols as u64).unwrap().total();
        assert!(bytes(r) <= limit && bytes(r + 1) > limit, "{r} rows: {} bytes", bytes(r));
        assert_eq!(rows_per_shard(GgmlType::Q4_1, rows, cols, 1 << 30, "t").unwrap(), rows);
        // Not even one row fits.
        assert!(matches!(rows_per_shard(GgmlType::F32, 1, 4096, 1024, "t"), Err(GpuError::Limit { .. })));
    }
}
