//! GGUF metadata: an ordered key/value map with typed accessors. Accessors distinguish a
//! missing key (`Ok(None)`) from a key present with the wrong type (`Err`), so a consumer can
//! apply a default for the former and report the latter.

use std::collections::HashMap;

use crate::error::GgufError;

#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// GGUF arrays are homogeneous: every element has the same variant.
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// The GGUF type name, for error messages ("u32", "array of string", ...).
    pub fn type_name(&self) -> String {
        match self {
            MetadataValue::Array(items) => match items.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "empty array".to_string(),
            },
            other => other.scalar_type_name().to_string(),
        }
    }

    fn scalar_type_name(&self) -> &'static str {
        match self {
            MetadataValue::U8(_) => "u8",
            MetadataValue::I8(_) => "i8",
            MetadataValue::U16(_) => "u16",
            MetadataValue::I16(_) => "i16",
            MetadataValue::U32(_) => "u32",
            MetadataValue::I32(_) => "i32",
            MetadataValue::U64(_) => "u64",
            MetadataValue::I64(_) => "i64",
            MetadataValue::F32(_) => "f32",
            MetadataValue::F64(_) => "f64",
            MetadataValue::Bool(_) => "bool",
            MetadataValue::String(_) => "string",
            MetadataValue::Array(_) => "array",
        }
    }

    /// Any integer variant, widened; `None` for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Floats and integers as f64 (integers beyond 2^53 lose precision, as any float would).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }
}

/// Ordered key -> value map; iteration follows file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sets `key`, keeping its position if it already exists, appending it otherwise.
    pub fn set(&mut self, key: impl Into<String>, value: MetadataValue) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => {
                if let Some(entry) = self.entries.get_mut(i) {
                    entry.1 = value;
                }
            }
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Appends a new key; returns the value back if the key already exists (a GGUF file may
    /// not repeat a key).
    pub(crate) fn insert_new(&mut self, key: String, value: MetadataValue) -> Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(key);
        }
        self.set(key, value);
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).and_then(|&i| self.entries.get(i)).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetadataValue::String(s)) => Ok(Some(s)),
            Some(other) => Err(type_error(key, "string", other)),
        }
    }

    /// Accepts any integer type holding a non-negative value.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let int = value.as_i128().ok_or_else(|| type_error(key, "unsigned integer", value))?;
        u64::try_from(int).map(Some).map_err(|_| range_error(key, int, "u64"))
    }

    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.get_u64(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v).map(Some).map_err(|_| range_error(key, v.into(), "u32")),
        }
    }

    /// Accepts F32, F64 and integers.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value.as_f64().map(|v| Some(v as f32)).ok_or_else(|| type_error(key, "number", value)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetadataValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(type_error(key, "bool", other)),
        }
    }

    pub fn get_string_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        self.get_array(key, "array of string", |v| match v {
            MetadataValue::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// From any integer array; every element must fit in an i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        let Some(items) = self.get_array(key, "array of integer", MetadataValue::as_i128)? else {
            return Ok(None);
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                i32::try_from(v).map_err(|_| GgufError::MetadataValue {
                    key: key.to_string(),
                    reason: format!("element {i} = {v} does not fit in i32"),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// From any float or integer array.
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        Ok(self.get_array(key, "array of number", MetadataValue::as_f64)?.map(|items| items.into_iter().map(|v| v as f32).collect()))
    }

    /// Maps every element of the array at `key` with `convert`; a non-array or an element
    /// `convert` rejects is a type error naming `expected`.
    fn get_array<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl Fn(&'a MetadataValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let MetadataValue::Array(items) = value else {
            return Err(type_error(key, expected, value));
        };
        items.iter().map(|item| convert(item).ok_or_else(|| type_error(key, expected, value))).collect::<Result<Vec<_>, _>>().map(Some)
    }
}

fn type_error(key: &str, expected: &'static str, found: &MetadataValue) -> GgufError {
    GgufError::MetadataType { key: key.to_string(), expected, found: found.type_name() }
}

fn range_error(key: &str, value: i128, target: &str) -> GgufError {
    GgufError::MetadataValue { key: key.to_string(), reason: format!("value {value} does not fit in {target}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.set("b", MetadataValue::U32(7));
        m.set("a", MetadataValue::I8(-1));
        m.set("s", MetadataValue::String("x".into()));
        m.set("f", MetadataValue::F64(0.5));
        m.set("ints", MetadataValue::Array(vec![MetadataValue::I64(-3), MetadataValue::I64(4)]));
        m.set("big", MetadataValue::Array(vec![MetadataValue::U64(1 << 40)]));
        m.set("strs", MetadataValue::Array(vec![MetadataValue::String("p".into())]));
        m
    }

    #[test]
    fn typed_getters() {
        let m = sample();
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a", "s", "f", "ints", "big", "strs"]);
        assert_eq!(m.get_u32("b").unwrap(), Some(7));
        assert_eq!(m.get_u64("missing").unwrap(), None);
        assert!(matches!(m.get_u64("a"), Err(GgufError::MetadataValue { .. })));
        assert!(matches!(m.get_u32("s"), Err(GgufError::MetadataType { .. })));
        assert_eq!(m.get_f32("f").unwrap(), Some(0.5));
        assert_eq!(m.get_f32("b").unwrap(), Some(7.0));
        assert_eq!(m.get_str("s").unwrap(), Some("x"));
        assert!(matches!(m.get_bool("s"), Err(GgufError::MetadataType { .. })));
        assert_eq!(m.get_i32_array("ints").unwrap(), Some(vec![-3, 4]));
        assert!(matches!(m.get_i32_array("big"), Err(GgufError::MetadataValue { .. })));
        assert_eq!(m.get_f32_array("ints").unwrap(), Some(vec![-3.0, 4.0]));
        assert_eq!(m.get_string_array("strs").unwrap(), Some(vec!["p"]));
        let err = m.get_string_array("ints").unwrap_err();
        assert!(err.to_string().contains("array of i64"), "{err}");
    }

    #[test]
    fn set_keeps_position() {
        let mut m = sample();
        m.set("b", MetadataValue::Bool(true));
        assert_eq!(m.iter().next(), Some(("b", &MetadataValue::Bool(true))));
        assert_eq!(m.len(), 7);
    }
}
