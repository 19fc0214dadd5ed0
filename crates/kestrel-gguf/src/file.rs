//! Native convenience: GGUF files on disk, read in chunks through the stream reader so a
//! model is never held in memory twice.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::GgufError;
use crate::header::{parse_header, GgufHeader};
use crate::stream::{EventSink, GgufStreamReader, StreamEvent};

const CHUNK: usize = 1 << 20;

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> GgufError + '_ {
    move |source| GgufError::Io { path: path.display().to_string(), source }
}

/// Streams the file at `path` through `on_event`. Knowing the file size, it rejects tensors
/// that lie past the end of the file as soon as the header is parsed.
pub fn stream_file(path: &Path, on_event: &mut EventSink<'_>) -> Result<(), GgufError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let file_len = file.metadata().map_err(io_error(path))?.len();
    let mut reader = GgufStreamReader::new();
    let mut checked = |event: StreamEvent<'_>| {
        if let StreamEvent::Header(header) = &event {
            header.check_file_len(file_len)?;
        }
        on_event(event)
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf).map_err(io_error(path))?;
        let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
            break;
        };
        reader.push(chunk, &mut checked)?;
    }
    reader.finish()
}

/// Reads the whole file: the header and every tensor's bytes, indexed like `header.tensors`.
pub fn read_file(path: &Path) -> Result<(GgufHeader, Vec<Vec<u8>>), GgufError> {
    let mut header = None;
    let mut tensors = Vec::new();
    stream_file(path, &mut |event| {
        match event {
            StreamEvent::Header(h) => {
                tensors = vec![Vec::new(); h.tensors.len()];
                header = Some(h.clone());
            }
            StreamEvent::Tensor { index, bytes, .. } => {
                if let Some(slot) = tensors.get_mut(index) {
                    *slot = bytes.to_vec();
                }
            }
        }
        Ok(())
    })?;
    // A successful stream always starts with the header event.
    let header = header.ok_or(GgufError::Truncated { context: "header".into(), offset: 0, missing: 0 })?;
    Ok((header, tensors))
}

/// Reads only as much of the file at `path` as its header needs.
pub fn read_header(path: &Path) -> Result<GgufHeader, GgufError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let mut bytes = Vec::new();
    let mut want: u64 = 1 << 20;
    loop {
        let have = bytes.len() as u64;
        (&mut file).take(want.saturating_sub(have)).read_to_end(&mut bytes).map_err(io_error(path))?;
        match parse_header(&bytes) {
            Err(GgufError::NeedMoreData { needed, .. }) if bytes.len() as u64 > have => want = needed.max(2 * want),
            result => return result,
        }
    }
}
