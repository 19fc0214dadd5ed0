//! The one error type of the crate. Every variant names what is wrong and, where the input is
//! a file, the byte offset and the key or tensor involved, so a bad model can be diagnosed
//! from the message alone.

use crate::types::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The buffer ends inside the header. `needed` is a lower bound on the total number of
    /// bytes the header needs; an incremental reader waits for at least that many.
    #[error("GGUF header incomplete: {context} needs at least {needed} bytes, only {available} available")]
    NeedMoreData { needed: u64, available: u64, context: String },

    /// The input ended for good (end of stream or end of file) before `context` was complete.
    #[error("GGUF file truncated: {context} is incomplete at offset {offset}, {missing} bytes missing")]
    Truncated { context: String, offset: u64, missing: u64 },

    #[error("not a GGUF file: magic bytes at offset 0 are {found:02x?}, expected \"GGUF\"{}", looks_like(.found))]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {version} at offset 4 (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },

    #[error("big-endian GGUF files are not supported (version field at offset 4 reads {raw:#010x})")]
    BigEndian { raw: u32 },

    #[error("{what} count {count} at offset {offset} exceeds the limit of {max}")]
    TooMany { what: String, count: u64, max: u64, offset: u64 },

    #[error("{context}: string length {len} at offset {offset} exceeds the limit of {max}")]
    StringTooLong { context: String, len: u64, max: u64, offset: u64 },

    #[error("{context}: string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { context: String, offset: u64 },

    #[error("{context}: unknown metadata value type {type_id} at offset {offset}")]
    UnknownValueType { context: String, type_id: u32, offset: u64 },

    #[error("{context}: arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep { context: String, max: u32, offset: u64 },

    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },

    #[error("duplicate tensor name {name:?} at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },

    #[error("tensor {name:?}: unknown ggml type id {type_id} at offset {offset}")]
    UnknownTensorType { name: String, type_id: u32, offset: u64 },

    #[error("tensor {name:?}: {n_dims} dimensions at offset {offset}, at most {max} are allowed")]
    TooManyDims { name: String, n_dims: u32, max: u32, offset: u64 },

    #[error("tensor {name:?}: bad shape {dims:?} ({reason})")]
    BadShape { name: String, dims: Vec<u64>, reason: String },

    #[error("metadata key \"general.alignment\" = {value} is not a nonzero power of two")]
    BadAlignment { value: u64 },

    #[error("tensor {name:?}: data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset { name: String, offset: u64, alignment: u64 },

    #[error("tensors {first:?} and {second:?} overlap: {second:?} starts at data offset {offset}, before {first:?} ends at {first_end}")]
    OverlappingTensors { first: String, second: String, offset: u64, first_end: u64 },

    #[error("tensor {name:?}: data ends at file offset {end}, past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds { name: String, end: u64, file_len: u64 },

    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    MetadataType { key: String, expected: &'static str, found: String },

    #[error("metadata key {key:?}: {reason}")]
    MetadataValue { key: String, reason: String },

    #[error("ggml type {ty} is not supported for {operation}")]
    UnsupportedType { ty: GgmlType, operation: &'static str },

    #[error("{what}: expected {expected}, got {found}")]
    SizeMismatch { what: String, expected: u64, found: u64 },

    /// An error about one tensor's data, with the tensor's name.
    #[error("tensor {name:?}: {source}")]
    InTensor { name: String, source: Box<GgufError> },

    /// Returned by a stream consumer's callback to reject the model (for example a tensor type
    /// it cannot use); the message is the consumer's.
    #[error("{0}")]
    Rejected(String),

    /// The shards of a split model do not make one model.
    #[error("split model: {reason}")]
    Split { reason: String },

    #[error("cannot allocate {bytes} bytes for {context}")]
    Allocation { context: String, bytes: u64 },

    #[error("the GGUF stream already failed and cannot accept more data")]
    StreamFailed,

    #[error("I/O error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// What a file that is not GGUF seems to be from its first bytes, for the magic-bytes error: most
/// often a web page or an API's JSON saved or served in place of the model (a model hub's page of
/// the file instead of its download link, a dev server's index.html for a wrong path).
fn looks_like(start: &[u8; 4]) -> String {
    let text = String::from_utf8_lossy(start);
    match start[0] {
        b'<' => format!(" (they read {text:?}: an HTML page or XML document, not the model file; check its URL or download)"),
        b'{' | b'[' => format!(" (they read {text:?}: JSON, not the model file; check its URL or download)"),
        _ if start.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) => {
            format!(" (they read {text:?}: text, not the model file; check its URL or download)")
        }
        _ => String::new(),
    }
}
