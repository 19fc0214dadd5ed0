//! Incremental GGUF reading for data that arrives in chunks (a browser fetch, a file read in
//! pieces). Only the header is buffered whole; after it, each tensor is handed out as soon as
//! its bytes are complete, straight from the incoming chunk when it lies inside one, otherwise
//! from a buffer holding just that tensor.

use crate::error::GgufError;
use crate::header::{parse_header, GgufHeader};
use crate::header_scan::{HeaderScanner, Scan};
use crate::tensor::TensorInfo;

/// A header larger than this is treated as corrupt rather than buffered further.
pub const MAX_HEADER_BYTES: u64 = 1 << 30;

pub enum StreamEvent<'a> {
    /// Sent once, before any tensor.
    Header(&'a GgufHeader),
    /// Tensors come in data-offset order; `index` is the position in `GgufHeader::tensors`.
    Tensor { index: usize, info: &'a TensorInfo, bytes: &'a [u8] },
}

pub type EventSink<'s> = dyn FnMut(StreamEvent<'_>) -> Result<(), GgufError> + 's;

enum Phase {
    /// Header bytes so far; the scanner says when they are complete, so the header is
    /// parsed once, not once per chunk.
    Header {
        buf: Vec<u8>,
        scanner: HeaderScanner,
    },
    Data(Box<DataPhase>),
    Failed,
}

struct DataPhase {
    header: GgufHeader,
    order: Vec<usize>,
    /// Position in `order` of the tensor being completed.
    next: usize,
    /// Absolute file offset of the next byte to arrive.
    pos: u64,
    /// Bytes of the current tensor when it spans chunks.
    pending: Vec<u8>,
}

pub struct GgufStreamReader {
    phase: Phase,
    consumed: u64,
}

impl Default for GgufStreamReader {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufStreamReader {
    pub fn new() -> Self {
        Self { phase: Phase::Header { buf: Vec::new(), scanner: HeaderScanner::new() }, consumed: 0 }
    }

    /// Total bytes pushed so far.
    pub fn bytes_consumed(&self) -> u64 {
        self.consumed
    }

    /// Where the next tensor to be delivered ends (an absolute offset), once the header has been
    /// parsed and while one remains: a reader holding the whole file (a memory map) pushes up to
    /// there, so that each tensor arrives whole in one chunk and is handed on without a copy.
    pub fn next_tensor_end(&self) -> Option<u64> {
        match &self.phase {
            Phase::Data(d) => {
                let info = d.order.get(d.next).and_then(|&i| d.header.tensors.get(i))?;
                Some(d.header.data_start + info.offset + info.n_bytes())
            }
            _ => None,
        }
    }

    /// The header, once it has been parsed.
    pub fn header(&self) -> Option<&GgufHeader> {
        match &self.phase {
            Phase::Data(d) => Some(&d.header),
            _ => None,
        }
    }

    /// Feeds the next chunk. Any error (including one returned by `on_event`) is final: the
    /// reader then refuses further input.
    pub fn push(&mut self, chunk: &[u8], on_event: &mut EventSink<'_>) -> Result<(), GgufError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Failed);
        let result = self.advance(phase, chunk, on_event);
        if result.is_err() {
            self.phase = Phase::Failed;
        }
        result
    }

    fn advance(&mut self, phase: Phase, chunk: &[u8], on_event: &mut EventSink<'_>) -> Result<(), GgufError> {
        self.consumed += chunk.len() as u64;
        match phase {
            Phase::Failed => Err(GgufError::StreamFailed),
            Phase::Data(mut data) => {
                let result = data.feed(chunk, on_event);
                self.phase = Phase::Data(data);
                result
            }
            Phase::Header { mut buf, mut scanner } => {
                buf.extend_from_slice(chunk);
                if let Scan::Incomplete = scanner.scan(&buf) {
                    return self.keep_buffering(buf, scanner);
                }
                match parse_header(&buf) {
                    Ok(header) => {
                        on_event(StreamEvent::Header(&header))?;
                        let mut data = Box::new(DataPhase { order: header.data_order(), header, next: 0, pos: 0, pending: Vec::new() });
                        // The buffer holds the header and maybe the first tensor bytes.
                        let result = data.feed(&buf, on_event);
                        self.phase = Phase::Data(data);
                        result
                    }
                    Err(GgufError::NeedMoreData { .. }) => self.keep_buffering(buf, scanner),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn keep_buffering(&mut self, buf: Vec<u8>, scanner: HeaderScanner) -> Result<(), GgufError> {
        let len = buf.len() as u64;
        if len > MAX_HEADER_BYTES {
            return Err(GgufError::TooMany { what: "header byte".to_string(), count: len, max: MAX_HEADER_BYTES, offset: 0 });
        }
        self.phase = Phase::Header { buf, scanner };
        Ok(())
    }

    /// Declares the end of input; fails if the header or a tensor is incomplete.
    pub fn finish(self) -> Result<(), GgufError> {
        match self.phase {
            Phase::Failed => Err(GgufError::StreamFailed),
            Phase::Header { buf, .. } => match parse_header(&buf) {
                Err(GgufError::NeedMoreData { needed, available, context }) => {
                    Err(GgufError::Truncated { context, offset: available, missing: needed - available })
                }
                Err(e) => Err(e),
                // The scanner reports completion whenever the parse can succeed, so a complete
                // header was already parsed and sent on: this arm is unreachable.
                Ok(header) => DataPhase::incomplete(&header, &header.data_order(), 0, 0),
            },
            Phase::Data(d) => DataPhase::incomplete(&d.header, &d.order, d.next, d.pos),
        }
    }
}

impl DataPhase {
    /// Consumes `chunk`, whose first byte is at absolute offset `self.pos`.
    fn feed(&mut self, mut chunk: &[u8], on_event: &mut EventSink<'_>) -> Result<(), GgufError> {
        loop {
            let Some((index, info)) = self.order.get(self.next).and_then(|&i| self.header.tensors.get(i).map(|t| (i, t))) else {
                // All tensors delivered: whatever follows is trailing padding.
                self.pos += chunk.len() as u64;
                return Ok(());
            };
            let start = self.header.data_start + info.offset;
            if self.pos < start {
                // Skip padding (or the header itself) before this tensor.
                let skip = (start - self.pos).min(chunk.len() as u64);
                chunk = chunk.get(skip as usize..).unwrap_or_default();
                self.pos += skip;
                if self.pos < start {
                    return Ok(());
                }
            }
            let size = info.n_bytes();
            let have = self.pending.len() as u64;
            let take = (size - have).min(chunk.len() as u64) as usize;
            let (part, rest) = chunk.split_at(take);
            self.pos += take as u64;
            chunk = rest;
            let bytes = if have == 0 && take as u64 == size {
                part
            } else {
                if have == 0 {
                    // Exactly the tensor's size, once, instead of doubling growth that could
                    // approach twice a large embedding. Fallible: the size comes from the file.
                    let no_room = || GgufError::Allocation { context: format!("data of tensor {:?}", info.name), bytes: size };
                    let size = usize::try_from(size).map_err(|_| no_room())?;
                    self.pending.try_reserve_exact(size).map_err(|_| no_room())?;
                }
                self.pending.extend_from_slice(part);
                if (self.pending.len() as u64) < size {
                    return Ok(());
                }
                &self.pending
            };
            on_event(StreamEvent::Tensor { index, info, bytes })?;
            // Release the buffer: holding the largest tensor's allocation for the rest of the
            // load would defeat streaming.
            self.pending = Vec::new();
            self.next += 1;
        }
    }

    /// Ok if every tensor was delivered, else the truncation error for the first missing one.
    fn incomplete(header: &GgufHeader, order: &[usize], next: usize, pos: u64) -> Result<(), GgufError> {
        let Some(t) = order.get(next).and_then(|&i| header.tensors.get(i)) else {
            return Ok(());
        };
        let end = header.data_start + t.offset + t.n_bytes();
        Err(GgufError::Truncated {
            context: format!("data of tensor {:?} ({} bytes)", t.name, t.n_bytes()),
            offset: pos,
            missing: end - pos,
        })
    }
}
