//! A bounds-checked little-endian reader over a byte prefix. Running out of bytes is not an
//! error of the data but of the prefix being short, so it yields `NeedMoreData` with the total
//! length required; the incremental reader uses that figure to know when to retry.

use crate::error::GgufError;

/// Strings longer than this are rejected before waiting for their bytes: no key, token or
/// chat template comes near it, and a stream must not buffer gigabytes on a corrupt length.
pub const MAX_STRING_LEN: u64 = 1 << 28;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// Fails with `NeedMoreData` unless `n` more bytes are available; `context` is built only
    /// on failure.
    pub fn require(&self, n: u64, context: impl Fn() -> String) -> Result<(), GgufError> {
        if n <= self.remaining() {
            return Ok(());
        }
        Err(GgufError::NeedMoreData { needed: self.pos().saturating_add(n), available: self.bytes.len() as u64, context: context() })
    }

    pub fn take(&mut self, n: u64, context: impl Fn() -> String) -> Result<&'a [u8], GgufError> {
        self.require(n, context)?;
        // `require` proved pos + n <= len, so the conversion and the slice are in bounds.
        let end = self.pos + n as usize;
        let slice = self.bytes.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(slice)
    }

    pub fn array<const N: usize>(&mut self, context: impl Fn() -> String) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, context)?);
        Ok(out)
    }

    pub fn u32(&mut self, context: impl Fn() -> String) -> Result<u32, GgufError> {
        self.array(context).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, context: impl Fn() -> String) -> Result<u64, GgufError> {
        self.array(context).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes.
    pub fn string(&mut self, context: impl Fn() -> String) -> Result<String, GgufError> {
        let offset = self.pos();
        let len = self.u64(&context)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::StringTooLong { context: context(), len, max: MAX_STRING_LEN, offset });
        }
        let bytes = self.take(len, &context)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { context: context(), offset: offset + 8 })
    }
}
