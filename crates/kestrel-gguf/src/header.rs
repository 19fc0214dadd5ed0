//! Parsing of the GGUF header (magic, version, metadata, tensor descriptors) from a byte
//! prefix, and validation of the tensor layout it declares.

use std::collections::HashSet;

use crate::cursor::Cursor;
use crate::error::GgufError;
use crate::metadata::{Metadata, MetadataValue};
use crate::tensor::{TensorInfo, MAX_DIMS};
use crate::types::GgmlType;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Sanity caps on declared counts: far above any real model, far below what would let a
/// corrupt count drive a huge allocation or loop.
pub const MAX_TENSORS: u64 = 1 << 24;
pub const MAX_METADATA_KEYS: u64 = 1 << 24;
pub const MAX_ARRAY_LEN: u64 = 1 << 31;
/// Arrays of arrays are legal; the cap bounds recursion depth.
pub const MAX_NESTING: u32 = 8;

#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: Metadata,
    /// In file (descriptor) order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_start: u64,
}

impl GgufHeader {
    /// Tensor indexes sorted by data offset: the order their bytes appear in the file.
    pub fn data_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.tensors.len()).collect();
        order.sort_by_key(|&i| self.tensors.get(i).map_or(0, |t| t.offset));
        order
    }

    /// Where the last tensor's data ends: the bytes a reader needs, which is the file's size
    /// (less any padding after the last tensor). Known once the header is read, so a download
    /// without a `Content-Length` still has a total.
    pub fn data_end(&self) -> u64 {
        self.tensors.iter().map(|t| self.data_start.saturating_add(t.offset).saturating_add(t.n_bytes())).max().unwrap_or(self.data_start)
    }

    /// Checks that every tensor's data lies within a file of `file_len` bytes.
    pub fn check_file_len(&self, file_len: u64) -> Result<(), GgufError> {
        for t in &self.tensors {
            let end = self.data_start.saturating_add(t.offset).saturating_add(t.n_bytes());
            if end > file_len {
                return Err(GgufError::TensorOutOfBounds { name: t.name.clone(), end, file_len });
            }
        }
        Ok(())
    }

    /// The bytes of tensor `index` within the complete file `file`.
    pub fn tensor_bytes<'a>(&self, index: usize, file: &'a [u8]) -> Result<&'a [u8], GgufError> {
        let t = self.tensors.get(index).ok_or_else(|| GgufError::SizeMismatch {
            what: "tensor index".to_string(),
            expected: self.tensors.len() as u64,
            found: index as u64,
        })?;
        self.check_file_len(file.len() as u64)?;
        let start = (self.data_start + t.offset) as usize;
        file.get(start..start + t.n_bytes() as usize).ok_or_else(|| GgufError::TensorOutOfBounds {
            name: t.name.clone(),
            end: self.data_start + t.offset + t.n_bytes(),
            file_len: file.len() as u64,
        })
    }
}

/// Parses the header from `bytes`, which may be the whole file or any prefix of it. A prefix
/// that ends inside the header gives `NeedMoreData`; nothing is allocated beyond what the
/// bytes present can justify.
pub fn parse_header(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    let mut c = Cursor::new(bytes);
    let header_ctx = || "header".to_string();
    let magic = c.array::<4>(header_ctx)?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(header_ctx)?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => return Err(GgufError::BigEndian { raw: v }),
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }
    let n_tensors = read_count(&mut c, "tensor", MAX_TENSORS)?;
    let n_kv = read_count(&mut c, "metadata key", MAX_METADATA_KEYS)?;

    let metadata = parse_metadata(&mut c, n_kv)?;
    let alignment = match metadata.get_u64(ALIGNMENT_KEY)? {
        None => DEFAULT_ALIGNMENT,
        Some(a) if a.is_power_of_two() => a,
        Some(a) => return Err(GgufError::BadAlignment { value: a }),
    };
    let tensors = parse_tensor_infos(&mut c, n_tensors, alignment)?;
    let data_start = c.pos().checked_next_multiple_of(alignment).ok_or(GgufError::BadAlignment { value: alignment })?;
    check_overlaps(&tensors)?;
    Ok(GgufHeader { version, metadata, tensors, alignment, data_start })
}

fn read_count(c: &mut Cursor, what: &str, max: u64) -> Result<u64, GgufError> {
    let offset = c.pos();
    let count = c.u64(|| format!("{what} count"))?;
    if count > max {
        return Err(GgufError::TooMany { what: what.to_string(), count, max, offset });
    }
    Ok(count)
}

fn parse_metadata(c: &mut Cursor, n_kv: u64) -> Result<Metadata, GgufError> {
    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let offset = c.pos();
        let key = c.string(|| format!("name of metadata key #{i}"))?;
        let ctx = || format!("metadata key {key:?}");
        let type_id = c.u32(ctx)?;
        let value = parse_value(c, type_id, &ctx, 0)?;
        metadata.insert_new(key, value).map_err(|key| GgufError::DuplicateKey { key, offset })?;
    }
    Ok(metadata)
}

/// Smallest encoding of one value of `type_id`: lets an array's declared count be checked
/// against the bytes present before anything is allocated for it.
fn min_encoded_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn parse_value(c: &mut Cursor, type_id: u32, ctx: &dyn Fn() -> String, depth: u32) -> Result<MetadataValue, GgufError> {
    // Offset of the type id just read (element types of arrays are checked in parse_array).
    let offset = c.pos().saturating_sub(4);
    Ok(match type_id {
        0 => MetadataValue::U8(u8::from_le_bytes(c.array(ctx)?)),
        1 => MetadataValue::I8(i8::from_le_bytes(c.array(ctx)?)),
        2 => MetadataValue::U16(u16::from_le_bytes(c.array(ctx)?)),
        3 => MetadataValue::I16(i16::from_le_bytes(c.array(ctx)?)),
        4 => MetadataValue::U32(c.u32(ctx)?),
        5 => MetadataValue::I32(i32::from_le_bytes(c.array(ctx)?)),
        6 => MetadataValue::F32(f32::from_le_bytes(c.array(ctx)?)),
        7 => {
            let pos = c.pos();
            match c.array::<1>(ctx)? {
                [0] => MetadataValue::Bool(false),
                [1] => MetadataValue::Bool(true),
                [b] => {
                    return Err(GgufError::MetadataValue {
                        key: ctx(),
                        reason: format!("bool byte {b} at offset {pos} is neither 0 nor 1"),
                    })
                }
            }
        }
        8 => MetadataValue::String(c.string(ctx)?),
        9 => parse_array(c, ctx, depth)?,
        10 => MetadataValue::U64(c.u64(ctx)?),
        11 => MetadataValue::I64(i64::from_le_bytes(c.array(ctx)?)),
        12 => MetadataValue::F64(f64::from_le_bytes(c.array(ctx)?)),
        _ => return Err(GgufError::UnknownValueType { context: ctx(), type_id, offset }),
    })
}

fn parse_array(c: &mut Cursor, ctx: &dyn Fn() -> String, depth: u32) -> Result<MetadataValue, GgufError> {
    let offset = c.pos();
    if depth >= MAX_NESTING {
        return Err(GgufError::NestingTooDeep { context: ctx(), max: MAX_NESTING, offset });
    }
    let elem_type = c.u32(ctx)?;
    let min_size = min_encoded_size(elem_type).ok_or_else(|| GgufError::UnknownValueType { context: ctx(), type_id: elem_type, offset })?;
    let count_offset = c.pos();
    let count = c.u64(ctx)?;
    if count > MAX_ARRAY_LEN {
        return Err(GgufError::TooMany { what: format!("array element ({})", ctx()), count, max: MAX_ARRAY_LEN, offset: count_offset });
    }
    // Fails early (and without allocating) when the declared count cannot fit in what is left.
    c.require(count * min_size, ctx)?;
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        items.push(parse_value(c, elem_type, ctx, depth + 1)?);
    }
    Ok(MetadataValue::Array(items))
}

fn parse_tensor_infos(c: &mut Cursor, n_tensors: u64, alignment: u64) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let offset = c.pos();
        let name = c.string(|| format!("name of tensor #{i}"))?;
        let ctx = || format!("tensor {name:?}");
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor { name, offset });
        }
        let dims_offset = c.pos();
        let n_dims = c.u32(ctx)?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims, max: MAX_DIMS, offset: dims_offset });
        }
        let dims = (0..n_dims).map(|_| c.u64(ctx)).collect::<Result<Vec<_>, _>>()?;
        let type_offset = c.pos();
        let type_id = c.u32(ctx)?;
        let offset = c.u64(ctx)?;
        let ggml_type =
            GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType { name: name.clone(), type_id, offset: type_offset })?;
        let info = TensorInfo { name, dims, ggml_type, offset };
        let n_bytes = info.checked_n_bytes()?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedOffset { name: info.name, offset, alignment });
        }
        if offset.checked_add(n_bytes).is_none_or(|end| end > i64::MAX as u64) {
            return Err(GgufError::BadShape {
                name: info.name,
                dims: info.dims,
                reason: format!("data offset {offset} + size {n_bytes} overflows"),
            });
        }
        tensors.push(info);
    }
    Ok(tensors)
}

/// No two tensors' data may overlap (sizes were validated, so the sums are exact). Compared
/// against the furthest end so far, not just the previous tensor, so a zero-sized tensor in
/// between cannot hide an overlap.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut sorted: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes() > 0).collect();
    sorted.sort_by_key(|t| t.offset);
    let mut furthest: Option<(&TensorInfo, u64)> = None;
    for t in sorted {
        if let Some((owner, end)) = furthest {
            if t.offset < end {
                return Err(GgufError::OverlappingTensors {
                    first: owner.name.clone(),
                    second: t.name.clone(),
                    offset: t.offset,
                    first_end: end,
                });
            }
        }
        furthest = Some((t, t.offset + t.n_bytes()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, cols: u64, offset: u64) -> TensorInfo {
        TensorInfo { name: name.into(), dims: vec![cols], ggml_type: GgmlType::F32, offset }
    }

    #[test]
    fn zero_sized_tensor_does_not_hide_an_overlap() {
        let ok = [tensor("a", 16, 0), tensor("empty", 0, 32), tensor("b", 8, 64)];
        check_overlaps(&ok).unwrap();
        let bad = [tensor("a", 64, 0), tensor("empty", 0, 32), tensor("b", 8, 128)];
        let err = check_overlaps(&bad).unwrap_err();
        assert!(matches!(&err, GgufError::OverlappingTensors { first, second, .. } if first == "a" && second == "b"), "{err}");
    }
}
