//! GGUF for Kestrel: an incremental reader (header first, then each tensor's bytes as they
//! arrive), the ggml quant block formats with CPU (de)quantizers, a writer and a whole-file
//! quantizer, and split models (`gguf-split`'s shards). File formats only: the GPU's layout of
//! the blocks is kestrel-gpu's.

mod cursor;
mod error;
mod file;
mod header;
mod header_scan;
mod metadata;
pub mod quant;
mod quantize_file;
mod quantize_recipe;
mod split;
mod stream;
mod tensor;
mod types;
mod writer;

pub use cursor::MAX_STRING_LEN;
pub use error::GgufError;
pub use file::{read_file, read_header, stream_file};
pub use header::{
    parse_header, GgufHeader, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_LEN, MAX_METADATA_KEYS, MAX_NESTING, MAX_TENSORS,
};
pub use metadata::{Metadata, MetadataValue};
pub use quant::{dequantize, quantize};
pub use quantize_file::{quantize_model, QuantizeReport};
pub use quantize_recipe::QuantizeTarget;
pub use split::{
    merge_headers, model_files, read_model_header, shard_name, shard_names, shard_paths, split_model, ShardInfo, ShardSequence, SplitLimit,
    SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY,
};
pub use stream::{EventSink, GgufStreamReader, StreamEvent, MAX_HEADER_BYTES};
pub use tensor::{TensorInfo, MAX_DIMS};
pub use types::GgmlType;
pub use writer::{GgufWriter, TensorSpec};
