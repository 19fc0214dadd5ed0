//! Reference embedding gather.

/// Rows `ids` of `table` (`rows` x `cols`, row-major), concatenated; an id >= rows gives zeros
/// (as the GPU kernel does).
pub fn embedding(table: &[f32], rows: usize, cols: usize, ids: &[u32]) -> Vec<f32> {
    assert_eq!(table.len(), rows * cols, "embedding: table is not {rows} x {cols}");
    let mut out = Vec::with_capacity(ids.len() * cols);
    for &id in ids {
        match table.chunks_exact(cols).nth(id as usize) {
            Some(row) => out.extend_from_slice(row),
            None => out.resize(out.len() + cols, 0.0),
        }
    }
    out
}
