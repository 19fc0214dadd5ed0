//! Finds where the GGUF header ends while its bytes are still arriving, in time linear in the
//! header size whatever the chunk sizes: it walks the structure once, reading only lengths,
//! counts and type ids, and resumes where it stopped when more bytes come. The full parse
//! (`parse_header`) then runs exactly once. The scanner does not judge the data: on anything
//! it does not expect it gives up, and the parser is run to report the precise error.

use crate::cursor::MAX_STRING_LEN;
use crate::header::{GGUF_MAGIC, MAX_ARRAY_LEN, MAX_METADATA_KEYS, MAX_TENSORS};
use crate::tensor::MAX_DIMS;

#[derive(Clone, Copy)]
enum Item {
    /// Fixed-size bytes to skip.
    Skip(u64),
    /// Magic, version, tensor count, key count.
    Preamble,
    /// u64 length + bytes.
    Str,
    /// Key string, then type id, then value.
    Kv,
    KvValue,
    Value(u32),
    /// `count` more values of type `elem`.
    Values {
        elem: u32,
        count: u64,
    },
    /// `count` more metadata entries.
    Kvs(u64),
    /// `count` more tensor descriptors.
    Tensors(u64),
    /// A tensor descriptor after its name: dims count, dims, type, offset.
    TensorRest,
}

pub(crate) enum Scan {
    /// The whole header has arrived.
    Complete,
    /// More bytes are needed.
    Incomplete,
    /// The data is malformed here; only the parser can say how.
    GiveUp,
}

pub(crate) struct HeaderScanner {
    pos: u64,
    stack: Vec<Item>,
    gave_up: bool,
}

fn fixed_size(type_id: u32) -> Option<u64> {
    match type_id {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

impl HeaderScanner {
    pub fn new() -> Self {
        Self { pos: 0, stack: vec![Item::Preamble], gave_up: false }
    }

    /// Advances over `buf` (all bytes received so far, from offset 0).
    pub fn scan(&mut self, buf: &[u8]) -> Scan {
        if self.gave_up {
            return Scan::GiveUp;
        }
        while let Some(item) = self.stack.pop() {
            match self.step(item, buf) {
                Step::Done => {}
                Step::Wait => {
                    self.stack.push(item);
                    return Scan::Incomplete;
                }
                Step::GiveUp => {
                    self.gave_up = true;
                    return Scan::GiveUp;
                }
            }
        }
        Scan::Complete
    }

    /// `N` bytes at `offset` past the current position, if they have arrived.
    fn read<const N: usize>(&self, buf: &[u8], offset: u64) -> Option<[u8; N]> {
        let start = usize::try_from(self.pos.checked_add(offset)?).ok()?;
        buf.get(start..start.checked_add(N)?)?.try_into().ok()
    }

    fn step(&mut self, item: Item, buf: &[u8]) -> Step {
        let u32_at = |s: &Self, offset| s.read(buf, offset).map(u32::from_le_bytes);
        let u64_at = |s: &Self, offset| s.read(buf, offset).map(u64::from_le_bytes);
        match item {
            Item::Skip(n) => {
                if (buf.len() as u64).saturating_sub(self.pos) < n {
                    return Step::Wait;
                }
                self.pos += n;
            }
            Item::Preamble => {
                let (Some(magic), Some(n_tensors), Some(n_kv)) = (self.read::<4>(buf, 0), u64_at(self, 8), u64_at(self, 16)) else {
                    return Step::Wait;
                };
                if magic != GGUF_MAGIC || n_tensors > MAX_TENSORS || n_kv > MAX_METADATA_KEYS {
                    return Step::GiveUp;
                }
                self.pos += 24;
                self.stack.extend([Item::Tensors(n_tensors), Item::Kvs(n_kv)]);
            }
            Item::Str => {
                let Some(len) = u64_at(self, 0) else {
                    return Step::Wait;
                };
                if len > MAX_STRING_LEN {
                    return Step::GiveUp;
                }
                self.pos += 8;
                self.stack.push(Item::Skip(len));
            }
            Item::Kv => self.stack.extend([Item::KvValue, Item::Str]),
            Item::KvValue => {
                let Some(type_id) = u32_at(self, 0) else {
                    return Step::Wait;
                };
                self.pos += 4;
                self.stack.push(Item::Value(type_id));
            }
            Item::Value(type_id) => match (type_id, fixed_size(type_id)) {
                (_, Some(n)) => self.stack.push(Item::Skip(n)),
                (8, None) => self.stack.push(Item::Str),
                (9, None) => {
                    let (Some(elem), Some(count)) = (u32_at(self, 0), u64_at(self, 4)) else {
                        return Step::Wait;
                    };
                    if count > MAX_ARRAY_LEN {
                        return Step::GiveUp;
                    }
                    self.pos += 12;
                    self.stack.push(Item::Values { elem, count });
                }
                _ => return Step::GiveUp,
            },
            Item::Values { elem, count } => {
                if count == 0 {
                    return Step::Done;
                }
                match fixed_size(elem) {
                    // Fixed-size elements are skipped in one go: count * size cannot overflow.
                    Some(n) => self.stack.push(Item::Skip(count * n)),
                    None => self.stack.extend([Item::Values { elem, count: count - 1 }, Item::Value(elem)]),
                }
            }
            Item::Kvs(count) | Item::Tensors(count) if count == 0 => {}
            Item::Kvs(count) => self.stack.extend([Item::Kvs(count - 1), Item::Kv]),
            Item::Tensors(count) => self.stack.extend([Item::Tensors(count - 1), Item::TensorRest, Item::Str]),
            Item::TensorRest => {
                let Some(n_dims) = u32_at(self, 0) else {
                    return Step::Wait;
                };
                if n_dims > MAX_DIMS {
                    return Step::GiveUp;
                }
                self.pos += 4;
                self.stack.push(Item::Skip(8 * u64::from(n_dims) + 12));
            }
        }
        Step::Done
    }
}

enum Step {
    Done,
    Wait,
    GiveUp,
}
