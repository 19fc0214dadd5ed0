//! Writing GGUF v3 files. The header (metadata in its given order, tensor descriptors with
//! offsets computed here) is written up front, then tensors are written one by one in the
//! declared order, so a converter can stream: it never needs all tensor data at once.

use std::collections::HashSet;
use std::io::Write;

use crate::error::GgufError;
use crate::header::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::metadata::{Metadata, MetadataValue};
use crate::tensor::{TensorInfo, MAX_DIMS};
use crate::types::GgmlType;

const VERSION: u32 = 3;

/// A tensor to be written: its data offset is assigned by the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

pub struct GgufWriter<W: Write> {
    out: W,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Index of the next tensor to write.
    next: usize,
}

fn write_error(source: std::io::Error) -> GgufError {
    GgufError::Io { path: "GGUF writer output".to_string(), source }
}

impl<W: Write> GgufWriter<W> {
    /// Validates the tensors, lays them out and writes the header and its padding.
    pub fn new(mut out: W, metadata: &Metadata, specs: &[TensorSpec]) -> Result<Self, GgufError> {
        let alignment = match metadata.get_u64(ALIGNMENT_KEY)? {
            None => DEFAULT_ALIGNMENT,
            Some(a) if a.is_power_of_two() => a,
            Some(a) => return Err(GgufError::BadAlignment { value: a }),
        };
        let tensors = layout(specs, alignment)?;
        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata.iter() {
            put_string(&mut header, key);
            put_u32(&mut header, value_type(value));
            put_value(&mut header, key, value)?;
        }
        for t in &tensors {
            put_string(&mut header, &t.name);
            put_u32(&mut header, t.dims.len() as u32);
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            put_u32(&mut header, t.ggml_type.id());
            header.extend_from_slice(&t.offset.to_le_bytes());
        }
        pad(&mut header, alignment);
        out.write_all(&header).map_err(write_error)?;
        Ok(Self { out, tensors, alignment, next: 0 })
    }

    /// The descriptors as they are written, offsets included.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the data of the next tensor in declaration order.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let Some(t) = self.tensors.get(self.next) else {
            return Err(GgufError::SizeMismatch {
                what: "tensors written".to_string(),
                expected: self.tensors.len() as u64,
                found: self.next as u64 + 1,
            });
        };
        if bytes.len() as u64 != t.n_bytes() {
            return Err(GgufError::SizeMismatch {
                what: format!("data of tensor {:?} (bytes)", t.name),
                expected: t.n_bytes(),
                found: bytes.len() as u64,
            });
        }
        let padding = bytes.len().next_multiple_of(self.alignment as usize) - bytes.len();
        self.out.write_all(bytes).map_err(write_error)?;
        self.out.write_all(&vec![0u8; padding]).map_err(write_error)?;
        self.next += 1;
        Ok(())
    }

    /// Checks every tensor was written and flushes; returns the output.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if self.next != self.tensors.len() {
            return Err(GgufError::SizeMismatch {
                what: "tensors written".to_string(),
                expected: self.tensors.len() as u64,
                found: self.next as u64,
            });
        }
        self.out.flush().map_err(write_error)?;
        Ok(self.out)
    }
}

/// Assigns aligned offsets in declaration order, with the reader's shape checks.
fn layout(specs: &[TensorSpec], alignment: u64) -> Result<Vec<TensorInfo>, GgufError> {
    let mut names = HashSet::new();
    let mut offset = 0u64;
    let mut tensors = Vec::with_capacity(specs.len());
    for spec in specs {
        if !names.insert(spec.name.as_str()) {
            return Err(GgufError::DuplicateTensor { name: spec.name.clone(), offset });
        }
        if spec.dims.len() > MAX_DIMS as usize {
            return Err(GgufError::TooManyDims { name: spec.name.clone(), n_dims: spec.dims.len() as u32, max: MAX_DIMS, offset });
        }
        let info = TensorInfo { name: spec.name.clone(), dims: spec.dims.clone(), ggml_type: spec.ggml_type, offset };
        let end = offset.checked_add(info.checked_n_bytes()?);
        offset = end.and_then(|e| e.checked_next_multiple_of(alignment)).ok_or_else(|| GgufError::BadShape {
            name: info.name.clone(),
            dims: info.dims.clone(),
            reason: "data section size overflows".to_string(),
        })?;
        tensors.push(info);
    }
    Ok(tensors)
}

fn pad(buf: &mut Vec<u8>, alignment: u64) {
    buf.resize(buf.len().next_multiple_of(alignment as usize), 0);
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// GGUF value type id.
fn value_type(value: &MetadataValue) -> u32 {
    match value {
        MetadataValue::U8(_) => 0,
        MetadataValue::I8(_) => 1,
        MetadataValue::U16(_) => 2,
        MetadataValue::I16(_) => 3,
        MetadataValue::U32(_) => 4,
        MetadataValue::I32(_) => 5,
        MetadataValue::F32(_) => 6,
        MetadataValue::Bool(_) => 7,
        MetadataValue::String(_) => 8,
        MetadataValue::Array(_) => 9,
        MetadataValue::U64(_) => 10,
        MetadataValue::I64(_) => 11,
        MetadataValue::F64(_) => 12,
    }
}

/// The common type of an array's elements; GGUF arrays cannot mix types. An empty array is
/// written as an array of u8 (`MetadataValue` does not record its element type).
fn element_type(key: &str, items: &[MetadataValue]) -> Result<u32, GgufError> {
    let Some(first) = items.first() else {
        return Ok(0);
    };
    let ty = value_type(first);
    for item in items {
        if value_type(item) != ty {
            return Err(GgufError::MetadataType {
                key: key.to_string(),
                expected: "an array whose elements all have one type",
                found: format!("{} mixed with {}", first.type_name(), item.type_name()),
            });
        }
    }
    Ok(ty)
}

fn put_value(buf: &mut Vec<u8>, key: &str, value: &MetadataValue) -> Result<(), GgufError> {
    match value {
        MetadataValue::U8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Bool(v) => buf.push(u8::from(*v)),
        MetadataValue::String(s) => put_string(buf, s),
        MetadataValue::Array(items) => {
            put_u32(buf, element_type(key, items)?);
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(buf, key, item)?;
            }
        }
    }
    Ok(())
}
