//! Split models, as llama.cpp's `gguf-split` writes them for hosts that cap file sizes: shards
//! named `<prefix>-00001-of-00003.gguf`, each a whole GGUF file with its own header and data. The
//! first holds the model's metadata; every shard carries `split.no` (from 0), `split.count` and
//! `split.tensors.count` (the model's tensors over all shards); the tensors follow in the model's
//! order, each in exactly one shard (the first may hold none: `--no-tensor-first-split`).

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::file::{io_error, read_header};
use crate::header::GgufHeader;
use crate::metadata::{Metadata, MetadataValue};
use crate::writer::{GgufWriter, TensorSpec};

pub const SPLIT_NO_KEY: &str = "split.no";
pub const SPLIT_COUNT_KEY: &str = "split.count";
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// A shard's place in its split model, from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    /// From 0.
    pub no: u16,
    pub count: u16,
    /// The model's tensors over all its shards.
    pub tensors: u64,
}

impl ShardInfo {
    /// None for a whole model: no `split.count`, or 0 (which `gguf-split --merge` leaves in the
    /// file it merges).
    pub fn of(header: &GgufHeader) -> Result<Option<Self>, GgufError> {
        let int = |key: &str| -> Result<Option<i128>, GgufError> {
            match header.metadata.get(key) {
                None => Ok(None),
                Some(v) => v.as_i128().map(Some).ok_or_else(|| GgufError::MetadataType {
                    key: key.to_string(),
                    expected: "an integer",
                    found: v.type_name(),
                }),
            }
        };
        let count = match int(SPLIT_COUNT_KEY)? {
            None | Some(0) => return Ok(None),
            Some(c) => u16::try_from(c).map_err(|_| split_error(format!("{SPLIT_COUNT_KEY} = {c} is not 1 to 65535")))?,
        };
        let no = int(SPLIT_NO_KEY)?.ok_or_else(|| split_error(format!("{SPLIT_COUNT_KEY} = {count} without {SPLIT_NO_KEY}")))?;
        let no = u16::try_from(no)
            .ok()
            .filter(|&n| n < count)
            .ok_or_else(|| split_error(format!("{SPLIT_NO_KEY} = {no} in a split of {count}")))?;
        let tensors =
            int(SPLIT_TENSORS_COUNT_KEY)?.ok_or_else(|| split_error(format!("{SPLIT_COUNT_KEY} without {SPLIT_TENSORS_COUNT_KEY}")))?;
        let tensors = u64::try_from(tensors).map_err(|_| split_error(format!("{SPLIT_TENSORS_COUNT_KEY} = {tensors}")))?;
        Ok(Some(Self { no, count, tensors }))
    }
}

fn split_error(reason: String) -> GgufError {
    GgufError::Split { reason }
}

/// Checks that headers arriving one after another are the shards of one model, in order: the
/// first is shard 1 (or a whole model), each next one the next of the same count, and together
/// they hold `split.tensors.count` tensors with no name twice.
#[derive(Debug)]
pub struct ShardSequence {
    count: u16,
    tensors_total: u64,
    /// Shards seen so far.
    seen: u16,
    names: HashSet<String>,
}

impl ShardSequence {
    /// From the model's first file: a whole model is a split of one.
    pub fn first(header: &GgufHeader) -> Result<Self, GgufError> {
        let info = ShardInfo::of(header)?.unwrap_or(ShardInfo { no: 0, count: 1, tensors: header.tensors.len() as u64 });
        if info.no != 0 {
            return Err(split_error(format!("the model starts at shard {} of {}: give its first shard", info.no + 1, info.count)));
        }
        let mut sequence = Self { count: info.count, tensors_total: info.tensors, seen: 0, names: HashSet::new() };
        sequence.add(header)?;
        Ok(sequence)
    }

    /// The next shard's header.
    pub fn next(&mut self, header: &GgufHeader) -> Result<(), GgufError> {
        let expected = self.seen + 1;
        if self.seen >= self.count {
            return Err(split_error(format!("a shard after the last of {}", self.count)));
        }
        match ShardInfo::of(header)? {
            Some(info) if info.count == self.count && info.no == self.seen && info.tensors == self.tensors_total => self.add(header),
            Some(info) => Err(split_error(format!(
                "shard {expected} of {} is shard {} of {} with {} tensors in all, not {}",
                self.count,
                info.no + 1,
                info.count,
                info.tensors,
                self.tensors_total
            ))),
            None => Err(split_error(format!("shard {expected} of {} is not a shard (no {SPLIT_COUNT_KEY})", self.count))),
        }
    }

    fn add(&mut self, header: &GgufHeader) -> Result<(), GgufError> {
        for t in &header.tensors {
            if !self.names.insert(t.name.clone()) {
                return Err(split_error(format!("tensor {:?} is in shard {} and in an earlier one", t.name, self.seen + 1)));
            }
        }
        if self.names.len() as u64 > self.tensors_total {
            return Err(split_error(format!("the shards hold more than the {} tensors split.tensors.count declares", self.tensors_total)));
        }
        self.seen += 1;
        Ok(())
    }

    /// Shards in the model.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Shards seen so far.
    pub fn seen(&self) -> u16 {
        self.seen
    }

    /// Ok once every shard arrived with every tensor.
    pub fn finish(&self) -> Result<(), GgufError> {
        if self.seen < self.count {
            return Err(split_error(format!("only {} of the model's {} shards arrived", self.seen, self.count)));
        }
        if (self.names.len() as u64) < self.tensors_total {
            let reason = format!("the shards hold {} tensors, split.tensors.count declares {}", self.names.len(), self.tensors_total);
            return Err(split_error(reason));
        }
        Ok(())
    }
}

/// The name of shard `no` (from 0) of `count`: llama.cpp's `llama_split_path`.
pub fn shard_name(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", u32::from(no) + 1)
}

/// Every shard's name, from the first shard's (a path or a URL, whose query and fragment stay
/// with each name): `m-00001-of-00003.gguf` gives `m-00001-…`, `m-00002-…` and `m-00003-of-00003.gguf`.
/// None for any other name, a whole model's.
pub fn shard_names(first: &str) -> Option<Vec<String>> {
    let (name, tail) = match first.find(['?', '#']) {
        Some(i) if first.contains("://") => first.split_at(i),
        _ => (first, ""),
    };
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || no != "00001" || prefix.is_empty() {
        return None;
    }
    let count: u16 = count.parse().ok().filter(|&c| c >= 1)?;
    Some((0..count).map(|no| format!("{}{tail}", shard_name(prefix, no, count))).collect())
}

/// The header the split model would have as one file (what `gguf-split --merge` writes): the
/// first shard's metadata without the split keys, and every shard's tensors in order, laid out one
/// after another at the first shard's alignment. What a size estimate or an inspection reads;
/// the offsets are not the shards' own.
pub fn merge_headers(shards: &[GgufHeader]) -> Result<GgufHeader, GgufError> {
    let (first, rest) = shards.split_first().ok_or_else(|| split_error("no shards".into()))?;
    let mut sequence = ShardSequence::first(first)?;
    for header in rest {
        sequence.next(header)?;
    }
    sequence.finish()?;
    let mut metadata = Metadata::new();
    for (key, value) in first.metadata.iter().filter(|(k, _)| ![SPLIT_NO_KEY, SPLIT_COUNT_KEY, SPLIT_TENSORS_COUNT_KEY].contains(k)) {
        metadata.set(key, value.clone());
    }
    let mut tensors = Vec::new();
    let mut offset = 0u64;
    for t in shards.iter().flat_map(|h| &h.tensors) {
        tensors.push(crate::TensorInfo { offset, ..t.clone() });
        offset = offset.saturating_add(t.n_bytes()).next_multiple_of(first.alignment);
    }
    Ok(GgufHeader { version: first.version, metadata, tensors, alignment: first.alignment, data_start: first.data_start })
}

/// The shard files of the model at `path` when its name is a first shard's (`shard_names`), else
/// None.
pub fn shard_paths(path: &Path) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let names = shard_names(name)?;
    Some(names.into_iter().map(|n| path.with_file_name(n)).collect())
}

/// The files of the model at `path`: every shard where `path` names a first shard, else the file.
pub fn model_files(path: &Path) -> Vec<PathBuf> {
    shard_paths(path).unwrap_or_else(|| vec![path.to_path_buf()])
}

/// The model's header from its file, or from all its shards' files, merged (`merge_headers`),
/// where `path` names a first shard.
pub fn read_model_header(path: &Path) -> Result<GgufHeader, GgufError> {
    let first = read_header(path)?;
    if ShardInfo::of(&first)?.is_none() {
        return Ok(first);
    }
    let paths = shard_paths(path).ok_or_else(|| {
        split_error(format!("{} is a shard of a split model, but not named as its first (<prefix>-00001-of-NNNNN.gguf)", path.display()))
    })?;
    let mut headers = vec![first];
    for p in paths.iter().skip(1) {
        headers.push(read_header(p)?);
    }
    merge_headers(&headers)
}

/// How `split_model` cuts the model: at most this many tensors, or bytes of tensor data, a shard
/// (`gguf-split`'s `--split-max-tensors` and `--split-max-size`). A tensor larger than the byte
/// limit gets a shard of its own.
#[derive(Clone, Copy, Debug)]
pub enum SplitLimit {
    Tensors(usize),
    Bytes(u64),
}

/// Writes the model at `input` as shards `<prefix>-0000k-of-0000n.gguf`, as `gguf-split` does:
/// the first shard with all the metadata, each with the split keys, the tensors in the model's
/// order and the data copied unchanged. With `metadata_shard` the first shard holds only the
/// metadata (gguf-split's `--no-tensor-first-split`: a small file a page can read first). Returns
/// the shards' paths.
pub fn split_model(input: &Path, prefix: &str, limit: SplitLimit, metadata_shard: bool) -> Result<Vec<PathBuf>, GgufError> {
    let header = read_header(input)?;
    if ShardInfo::of(&header)?.is_some() {
        return Err(split_error(format!("{} is already a shard of a split model", input.display())));
    }
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    if metadata_shard {
        groups.push(Vec::new());
    }
    let mut bytes_in_group = 0u64;
    for (i, t) in header.tensors.iter().enumerate() {
        let size = t.n_bytes().next_multiple_of(header.alignment);
        let group = groups.last().map_or(0, Vec::len);
        let full = match limit {
            SplitLimit::Tensors(n) => group >= n.max(1),
            SplitLimit::Bytes(max) => group > 0 && bytes_in_group.saturating_add(size) > max,
        };
        if full {
            groups.push(Vec::new());
            bytes_in_group = 0;
        }
        bytes_in_group = bytes_in_group.saturating_add(size);
        if let Some(g) = groups.last_mut() {
            g.push(i);
        }
    }
    let count = u16::try_from(groups.len()).map_err(|_| split_error(format!("{} shards: at most 65535", groups.len())))?;
    // MAX_TENSORS bounds a parsed header's count far below i32's range.
    let tensors_count = i32::try_from(header.tensors.len()).map_err(|_| split_error(format!("{} tensors", header.tensors.len())))?;
    let mut file = File::open(input).map_err(io_error(input))?;
    let mut written = Vec::with_capacity(groups.len());
    for (no, group) in (0u16..).zip(&groups) {
        let mut metadata = if no == 0 { header.metadata.clone() } else { Metadata::new() };
        if no > 0 {
            if let Some(alignment) = header.metadata.get(crate::ALIGNMENT_KEY) {
                metadata.set(crate::ALIGNMENT_KEY, alignment.clone());
            }
        }
        metadata.set(SPLIT_NO_KEY, MetadataValue::U16(no));
        metadata.set(SPLIT_COUNT_KEY, MetadataValue::U16(count));
        metadata.set(SPLIT_TENSORS_COUNT_KEY, MetadataValue::I32(tensors_count));
        let infos: Vec<&crate::TensorInfo> = group.iter().filter_map(|&i| header.tensors.get(i)).collect();
        let specs: Vec<TensorSpec> =
            infos.iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type }).collect();
        // Each shard under a temporary name until all are written: an interrupted split leaves
        // no file that looks like a shard.
        let path = PathBuf::from(shard_name(prefix, no, count));
        let partial = PathBuf::from(format!("{}.tmp", path.display()));
        let out = std::io::BufWriter::new(File::create(&partial).map_err(io_error(&partial))?);
        let mut writer = GgufWriter::new(out, &metadata, &specs)?;
        for t in infos {
            let mut bytes = vec![0u8; usize::try_from(t.n_bytes()).map_err(|_| split_error(format!("tensor {:?} is too large", t.name)))?];
            file.seek(SeekFrom::Start(header.data_start + t.offset)).map_err(io_error(input))?;
            file.read_exact(&mut bytes).map_err(io_error(input))?;
            writer.write_tensor(&bytes)?;
        }
        writer.finish()?;
        written.push((partial, path));
    }
    let mut paths = Vec::with_capacity(written.len());
    for (partial, path) in written {
        std::fs::rename(&partial, &path).map_err(io_error(&path))?;
        paths.push(path);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_follow_the_first_shards_name() {
        assert_eq!(
            shard_names("models/m-00001-of-00003.gguf"),
            Some(vec!["models/m-00001-of-00003.gguf".into(), "models/m-00002-of-00003.gguf".into(), "models/m-00003-of-00003.gguf".into()])
        );
        // A URL's query stays with every shard; a path's `?` is part of the name.
        assert_eq!(
            shard_names("https://h.example/a-b-00001-of-00002.gguf?download=true"),
            Some(vec![
                "https://h.example/a-b-00001-of-00002.gguf?download=true".into(),
                "https://h.example/a-b-00002-of-00002.gguf?download=true".into()
            ])
        );
        assert_eq!(shard_names("m-00001-of-00001.gguf").map(|n| n.len()), Some(1));
        for not_first in
            ["m.gguf", "m-00002-of-00003.gguf", "m-1-of-3.gguf", "-00001-of-00003.gguf", "m-00001-of-00000.gguf", "m-00001-of-00003.bin"]
        {
            assert_eq!(shard_names(not_first), None, "{not_first}");
        }
    }
}
