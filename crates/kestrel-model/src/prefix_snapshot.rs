//! A token prefix's KV cache rows as bytes, kept across sessions and restored into a model later,
//! so that the next request prefills only what follows the prefix (the browser package's
//! `persistPrefix` stores them in the Origin Private File System).
//!
//! A snapshot comes back from storage the page does not control the lifetime of, so it is never
//! trusted: restoring checks its length and a SHA-256 of its content (else it is corrupt:
//! `bad_snapshot`), then that it was taken from the same model file (its key: the file's sha256)
//! with the same cache layout, value type and RoPE table (else it belongs to another setup:
//! `snapshot_mismatch`), and every token id.
//!
//! Layout, little-endian: the magic `KVPX`, the format version (u32), the model key's length
//! (u32) and bytes, `n_layers`, `n_kv_heads`, `head_dim`, the bytes per value (4: f32, 2: f16),
//! the RoPE table (`KvLayout::rope_table`) and `n_tokens` (u32 each), the token ids (u32 each),
//! then for each layer its K then its V rows: for each KV head, `n_tokens` rows of `head_dim`
//! values as the cache holds them. Last, the SHA-256 of everything before it.

use kestrel_gpu::kernels::attention::KvCache;
use kestrel_gpu::{Gpu, Readback, Tensor};
use kestrel_ops::params::KvType;
use sha2::{Digest, Sha256};

use crate::config::ModelConfig;
use crate::tensors::Role;
use crate::ModelError;

const MAGIC: &[u8; 4] = b"KVPX";
const VERSION: u32 = 3;
const DIGEST_BYTES: usize = 32;
/// Model keys are file digests; anything this long is not one.
const MAX_KEY_BYTES: usize = 256;
/// The magic, the version and the key's length.
const FIXED: usize = 12;
/// The six u32 fields after the key.
const SHAPE_FIELDS: usize = 24;

/// What a snapshot's rows depend on besides the weights: the KV cache's shape and value type, and
/// the RoPE frequency table its keys were rotated with (Phi-3's long or short factors follow the
/// context length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Bytes per stored value (`KvType::bytes`).
    pub value_bytes: usize,
    /// 0: no factors, 1: Llama 3's table, 2: Phi-3's short factors, 3: its long ones.
    pub rope_table: usize,
}

impl KvLayout {
    pub fn of(c: &ModelConfig, kv: KvType, max_ctx: usize) -> Self {
        let rope_table = match crate::tensors::rope_factors_role(c, max_ctx) {
            None => 0,
            Some(Role::RopeFactorsShort) => 2,
            Some(Role::RopeFactorsLong) => 3,
            Some(_) => 1,
        };
        Self { n_layers: c.n_layers, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim, value_bytes: kv.bytes(), rope_table }
    }

    /// Bytes of K and V rows for `n` tokens over every layer. Saturating: the fields of a forged
    /// header can multiply past u64, and a saturated size matches no file.
    pub fn rows_bytes(&self, n: usize) -> u64 {
        [self.n_layers, self.n_kv_heads, n, self.head_dim, self.value_bytes].iter().fold(2u64, |bytes, &f| bytes.saturating_mul(f as u64))
    }

    /// The size of a whole snapshot of `n` tokens under a key of `key_len` bytes.
    pub fn snapshot_bytes(&self, key_len: usize, n: usize) -> u64 {
        let fixed = (FIXED + key_len + SHAPE_FIELDS + DIGEST_BYTES) as u64;
        fixed.saturating_add(4 * n as u64).saturating_add(self.rows_bytes(n))
    }
}

/// What the start of a snapshot says: its tokens, or how many bytes are needed to read them.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    Tokens { key: String, tokens: Vec<u32> },
    NeedBytes(usize),
}

/// A snapshot read and checked: its tokens, and their rows in the layout above.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub tokens: Vec<u32>,
    pub rows: &'a [u8],
}

fn bad(reason: impl Into<String>) -> ModelError {
    ModelError::BadSnapshot(reason.into())
}

fn mismatch(reason: impl Into<String>) -> ModelError {
    ModelError::SnapshotMismatch(reason.into())
}

/// The header of a snapshot of `tokens`: everything before the rows.
fn encode_header(key: &str, layout: KvLayout, tokens: &[u32], capacity: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity as usize);
    out.extend_from_slice(MAGIC);
    for n in [VERSION, key.len() as u32] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(key.as_bytes());
    for n in [layout.n_layers, layout.n_kv_heads, layout.head_dim, layout.value_bytes, layout.rope_table, tokens.len()] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out
}

/// Appends the SHA-256 of everything in `out`.
fn seal(out: &mut Vec<u8>) {
    let digest = Sha256::digest(out.as_slice());
    out.extend_from_slice(&digest);
}

/// Serializes a snapshot of `tokens` whose rows (K and V per layer, as above) are `rows`.
pub fn encode(key: &str, layout: KvLayout, tokens: &[u32], rows: &[u8]) -> Vec<u8> {
    let mut out = encode_header(key, layout, tokens, layout.snapshot_bytes(key.len(), tokens.len()));
    out.extend_from_slice(rows);
    seal(&mut out);
    out
}

/// Reads little-endian u32 fields from the front of a byte slice.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    /// The next field (the caller has checked that the bytes hold it).
    fn next(&mut self) -> usize {
        let field = self.bytes.get(self.at..self.at + 4).map_or([0; 4], |f| [f[0], f[1], f[2], f[3]]);
        self.at += 4;
        u32::from_le_bytes(field) as usize
    }
}

/// The header fields up to the token ids: key, layout, token count, and where the ids start.
struct Header {
    key: String,
    layout: KvLayout,
    n_tokens: usize,
    tokens_at: usize,
}

/// Parses the header from `bytes`, or says how many bytes it needs.
fn header(bytes: &[u8]) -> Result<Result<Header, usize>, ModelError> {
    if bytes.len() < FIXED {
        return Ok(Err(FIXED));
    }
    if &bytes[..4] != MAGIC {
        return Err(bad("not a KV prefix snapshot"));
    }
    let mut f = Fields { bytes, at: 4 };
    let version = f.next() as u32;
    if version != VERSION {
        return Err(bad(format!("format version {version}, this build reads {VERSION}")));
    }
    let key_len = f.next();
    if key_len > MAX_KEY_BYTES {
        return Err(bad(format!("a {key_len}-byte model key")));
    }
    let tokens_at = FIXED + key_len + SHAPE_FIELDS;
    if bytes.len() < tokens_at {
        return Ok(Err(tokens_at));
    }
    let key = std::str::from_utf8(&bytes[FIXED..FIXED + key_len]).map_err(|_| bad("the model key is not UTF-8"))?.to_string();
    f.at = FIXED + key_len;
    let layout = KvLayout { n_layers: f.next(), n_kv_heads: f.next(), head_dim: f.next(), value_bytes: f.next(), rope_table: f.next() };
    let n_tokens = f.next();
    Ok(Ok(Header { key, layout, n_tokens, tokens_at }))
}

fn token_ids(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The model key and token ids from the start of a snapshot (to choose one before reading it
/// whole), or the number of leading bytes needed to tell them.
pub fn peek(bytes: &[u8]) -> Result<Peek, ModelError> {
    let h = match header(bytes)? {
        Ok(h) => h,
        Err(need) => return Ok(Peek::NeedBytes(need)),
    };
    let end = h.tokens_at.saturating_add(h.n_tokens.saturating_mul(4));
    match bytes.get(h.tokens_at..end) {
        Some(ids) => Ok(Peek::Tokens { key: h.key, tokens: token_ids(ids) }),
        None => Ok(Peek::NeedBytes(end)),
    }
}

/// Checks a whole snapshot: intact (`bad_snapshot` if not), then taken from the model file
/// `key` with `layout` (`snapshot_mismatch` if not), with token ids inside `vocab`. Returns its
/// tokens and rows.
pub fn decode<'a>(bytes: &'a [u8], key: &str, layout: KvLayout, vocab: usize) -> Result<Snapshot<'a>, ModelError> {
    let h = header(bytes)?.map_err(|_| bad("the file ends inside its header"))?;
    // The length the header implies, in u64: a forged header cannot wrap it on wasm32.
    let expected = h.layout.snapshot_bytes(h.key.len(), h.n_tokens);
    if bytes.len() as u64 != expected {
        return Err(bad(format!("{} bytes where its header implies {expected}", bytes.len())));
    }
    let (content, digest) = bytes.split_at(bytes.len() - DIGEST_BYTES);
    if Sha256::digest(content).as_slice() != digest {
        return Err(bad("its checksum does not match its content"));
    }
    if h.key != key {
        return Err(mismatch("it was taken from another model file"));
    }
    if h.layout != layout {
        return Err(mismatch(format!("its KV layout {:?} is not this model's {layout:?}", h.layout)));
    }
    let rows_at = h.tokens_at + 4 * h.n_tokens;
    let tokens = token_ids(&content[h.tokens_at..rows_at]);
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(format!("token id {t} >= vocabulary {vocab}")));
    }
    Ok(Snapshot { tokens, rows: &content[rows_at..] })
}

/// The byte range of each KV head's first `n` rows of slot 0 (the one requests run in one at a time) in
/// one layer's K or V cache.
fn head_ranges(cache: &KvCache, n: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
    let row = cache.row_bytes() as u64;
    (0..cache.shape.n_kv_heads).map(move |h| (cache.row_offset(0, h, 0), n as u64 * row))
}

/// Serializes a snapshot of the first `tokens.len()` rows of every layer's K and V, copied back
/// from the GPU straight into the snapshot's buffer. One readback per cache tensor: each is no
/// larger than a buffer the device already holds.
pub async fn save(gpu: &Gpu, caches: &[KvCache], key: &str, layout: KvLayout, tokens: &[u32]) -> Result<Vec<u8>, ModelError> {
    let n = tokens.len();
    let tensors: Vec<(&KvCache, &Tensor)> = caches.iter().flat_map(|c| [(c, &c.k), (c, &c.v)]).collect();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let mut readbacks = Vec::with_capacity(tensors.len());
    for &(cache, tensor) in &tensors {
        let readback = Readback::new(gpu, (cache.shape.n_kv_heads * n * cache.row_bytes()) as u64);
        let mut at = 0;
        for (offset, size) in head_ranges(cache, n) {
            encoder.copy_buffer_to_buffer(&tensor.buffer, offset, readback.buffer(), at, size);
            at += size;
        }
        readbacks.push((readback, at));
    }
    gpu.queue.submit([encoder.finish()]);
    let mut out = encode_header(key, layout, tokens, layout.snapshot_bytes(key.len(), n));
    for (readback, size) in readbacks {
        out.extend(readback.read(gpu, size).await?);
    }
    gpu.check_faults()?;
    seal(&mut out);
    Ok(out)
}

/// Writes the first `keep` of a snapshot's `n` tokens' rows (`rows`, as `save` lays them out)
/// into the caches.
pub fn write_rows(gpu: &Gpu, caches: &[KvCache], n: usize, keep: usize, rows: &[u8]) -> Result<(), ModelError> {
    let mut at = 0usize;
    for cache in caches {
        for tensor in [&cache.k, &cache.v] {
            let row = cache.row_bytes();
            for (offset, _) in head_ranges(cache, keep) {
                let kept = rows.get(at..at + keep * row).ok_or_else(|| bad("its rows end early"))?;
                gpu.write(&tensor.buffer, offset, kept);
                at += n * row;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: KvLayout = KvLayout { n_layers: 2, n_kv_heads: 1, head_dim: 4, value_bytes: 2, rope_table: 0 };

    fn snapshot(tokens: &[u32]) -> Vec<u8> {
        let rows: Vec<u8> = (0..LAYOUT.rows_bytes(tokens.len())).map(|i| i as u8).collect();
        encode("key", LAYOUT, tokens, &rows)
    }

    #[test]
    fn decodes_what_it_encodes() {
        let bytes = snapshot(&[5, 6, 7]);
        assert_eq!(bytes.len() as u64, LAYOUT.snapshot_bytes(3, 3));
        let s = decode(&bytes, "key", LAYOUT, 10).unwrap();
        assert_eq!(s.tokens, [5, 6, 7]);
        assert_eq!(s.rows.len() as u64, LAYOUT.rows_bytes(3));
        assert!(s.rows.iter().enumerate().all(|(i, &b)| b == i as u8));
    }

    #[test]
    fn peek_asks_for_more_until_the_tokens_are_in() {
        let bytes = snapshot(&[5, 6, 7]);
        let mut have = 0;
        let tokens = loop {
            match peek(&bytes[..have]).unwrap() {
                Peek::NeedBytes(n) => {
                    assert!(n > have && n <= bytes.len(), "asked for {n} bytes with {have}");
                    have = n;
                }
                Peek::Tokens { key, tokens } => {
                    assert_eq!(key, "key");
                    break tokens;
                }
            }
        };
        assert_eq!(tokens, [5, 6, 7]);
    }

    #[test]
    fn refuses_every_single_byte_change_and_truncation() {
        let bytes = snapshot(&[5, 6]);
        for i in 0..bytes.len() {
            let mut changed = bytes.clone();
            changed[i] ^= 0x40;
            let code = |r: Result<Snapshot, ModelError>| r.map(|_| ()).unwrap_err().code();
            assert_eq!(code(decode(&changed, "key", LAYOUT, 10)), "bad_snapshot", "byte {i} changed");
            assert_eq!(code(decode(&bytes[..i], "key", LAYOUT, 10)), "bad_snapshot", "truncated to {i} bytes");
        }
    }

    #[test]
    fn tells_another_setup_from_corruption() {
        let bytes = snapshot(&[5, 6]);
        let code = |r: Result<Snapshot, ModelError>| r.map(|_| ()).unwrap_err().code();
        assert_eq!(code(decode(&bytes, "other", LAYOUT, 10)), "snapshot_mismatch");
        for other in [KvLayout { head_dim: 8, ..LAYOUT }, KvLayout { value_bytes: 4, ..LAYOUT }, KvLayout { rope_table: 3, ..LAYOUT }] {
            assert_eq!(code(decode(&bytes, "key", other, 10)), "snapshot_mismatch", "{other:?}");
        }
        // Token 6 is outside a 6-token vocabulary.
        assert_eq!(code(decode(&bytes, "key", LAYOUT, 6)), "bad_snapshot");
    }
}
