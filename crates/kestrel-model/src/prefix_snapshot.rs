//! A token prefix's KV cache rows as bytes, kept across sessions and restored into a model later,
//! so that the next request prefills only what follows the prefix (the browser package's
//! `persistPrefix` stores them in the Origin Private File System).
//!
//! A snapshot comes back from storage the page does not control the lifetime of, so it is never
//! trusted: restoring checks its layout against the model, the model key (the model file's
//! sha256) it was taken from, every token id, its length and a SHA-256 of its content.
//!
//! Layout, little-endian: the magic `KVPX`, the format version (u32), the model key's length
//! (u32) and bytes, `n_layers`, `n_kv_heads`, `head_dim` and `n_tokens` (u32 each), the token ids
//! (u32 each), then for each layer its K then its V rows: for each KV head, `n_tokens` rows of
//! `head_dim` f32 values. Last, the SHA-256 of everything before it.

use kestrel_gpu::kernels::attention::KvCache;
use kestrel_gpu::{Gpu, Readback, Tensor};
use sha2::{Digest, Sha256};

use crate::config::ModelConfig;
use crate::ModelError;

const MAGIC: &[u8; 4] = b"KVPX";
const VERSION: u32 = 1;
const DIGEST_BYTES: usize = 32;
/// Model keys are file digests; anything this long is not one.
const MAX_KEY_BYTES: usize = 256;

/// The KV cache shape a snapshot holds rows of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayout {
    pub fn of(c: &ModelConfig) -> Self {
        Self { n_layers: c.n_layers, n_kv_heads: c.n_kv_heads, head_dim: c.head_dim }
    }

    /// Bytes of K and V rows for `n` tokens over every layer.
    pub fn row_bytes(&self, n: usize) -> usize {
        2 * self.n_layers * self.n_kv_heads * n * self.head_dim * 4
    }
}

/// What the start of a snapshot says: its tokens, or how many bytes are needed to read them.
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    Tokens { key: String, tokens: Vec<u32> },
    NeedBytes(usize),
}

/// A snapshot read and checked: the tokens and their rows, in the layout above.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub tokens: Vec<u32>,
    pub rows: &'a [u8],
}

fn bad(reason: impl Into<String>) -> ModelError {
    ModelError::BadSnapshot(reason.into())
}

/// Serializes a snapshot of `tokens` whose rows (K and V per layer, as above) are `rows`.
pub fn encode(key: &str, layout: KvLayout, tokens: &[u32], rows: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + key.len() + 4 * tokens.len() + rows.len() + DIGEST_BYTES);
    out.extend_from_slice(MAGIC);
    for n in [VERSION, key.len() as u32] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(key.as_bytes());
    for n in [layout.n_layers, layout.n_kv_heads, layout.head_dim, tokens.len()] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(rows);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// Reads little-endian u32 fields from the front of a byte slice.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    /// The next u32, or None where the bytes end first.
    fn u32(&mut self) -> Option<u32> {
        let field = self.bytes.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_le_bytes([field[0], field[1], field[2], field[3]]))
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
    const FIXED: usize = 12;
    if bytes.len() < FIXED {
        return Ok(Err(FIXED));
    }
    if &bytes[..4] != MAGIC {
        return Err(bad("not a KV prefix snapshot"));
    }
    let mut f = Fields { bytes, at: 4 };
    let (Some(version), Some(key_len)) = (f.u32(), f.u32()) else { return Ok(Err(FIXED)) };
    if version != VERSION {
        return Err(bad(format!("format version {version}, this build reads {VERSION}")));
    }
    let key_len = key_len as usize;
    if key_len > MAX_KEY_BYTES {
        return Err(bad(format!("a {key_len}-byte model key")));
    }
    let tokens_at = FIXED + key_len + 16;
    if bytes.len() < tokens_at {
        return Ok(Err(tokens_at));
    }
    let key = std::str::from_utf8(&bytes[FIXED..FIXED + key_len]).map_err(|_| bad("the model key is not UTF-8"))?.to_string();
    f.at = FIXED + key_len;
    let mut next = || f.u32().map(|n| n as usize).unwrap_or_default();
    let layout = KvLayout { n_layers: next(), n_kv_heads: next(), head_dim: next() };
    let n_tokens = next();
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

/// Checks a whole snapshot against the model it is to be restored into (its key, layout,
/// vocabulary and context) and returns its tokens and rows.
pub fn decode<'a>(bytes: &'a [u8], key: &str, layout: KvLayout, vocab: usize, max_ctx: usize) -> Result<Snapshot<'a>, ModelError> {
    let h = header(bytes)?.map_err(|_| bad("the file ends inside its header"))?;
    if h.key != key {
        return Err(bad("it was taken from another model file"));
    }
    if h.layout != layout {
        return Err(bad(format!("its KV layout {:?} is not the model's {layout:?}", h.layout)));
    }
    // A restored prefix leaves room for the prompt's last token, which always runs.
    if h.n_tokens == 0 || h.n_tokens >= max_ctx {
        return Err(bad(format!("{} tokens (the context holds {max_ctx})", h.n_tokens)));
    }
    let rows_at = h.tokens_at + 4 * h.n_tokens;
    let expected = rows_at + layout.row_bytes(h.n_tokens) + DIGEST_BYTES;
    if bytes.len() != expected {
        return Err(bad(format!("{} bytes where its header implies {expected}", bytes.len())));
    }
    let (content, digest) = bytes.split_at(expected - DIGEST_BYTES);
    if Sha256::digest(content).as_slice() != digest {
        return Err(bad("its checksum does not match its content"));
    }
    let tokens = token_ids(&bytes[h.tokens_at..rows_at]);
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(format!("token id {t} >= vocabulary {vocab}")));
    }
    Ok(Snapshot { tokens, rows: &content[rows_at..] })
}

/// The byte range of each KV head's first `n` rows in one layer's K or V cache, whose layout is
/// `[n_kv_heads, max_ctx, head_dim]` f32.
fn head_ranges(cache: &KvCache, n: usize) -> impl Iterator<Item = (u64, u64)> {
    let s = cache.shape;
    let head_bytes = (s.max_ctx * s.head_dim * 4) as u64;
    (0..s.n_kv_heads as u64).map(move |h| (h * head_bytes, (n * s.head_dim * 4) as u64))
}

/// Copies the first `n` rows of every layer's K and V back from the GPU, in the snapshot's order.
/// One readback per cache tensor: each is no larger than a buffer the device already holds.
pub async fn read_rows(gpu: &Gpu, caches: &[KvCache], n: usize) -> Result<Vec<u8>, ModelError> {
    let tensors: Vec<(&KvCache, &Tensor)> = caches.iter().flat_map(|c| [(c, &c.k), (c, &c.v)]).collect();
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let mut readbacks = Vec::with_capacity(tensors.len());
    for &(cache, tensor) in &tensors {
        let readback = Readback::new(gpu, (cache.shape.n_kv_heads * n * cache.shape.head_dim * 4) as u64);
        let mut at = 0;
        for (offset, size) in head_ranges(cache, n) {
            encoder.copy_buffer_to_buffer(&tensor.buffer, offset, readback.buffer(), at, size);
            at += size;
        }
        readbacks.push((readback, at));
    }
    gpu.queue.submit([encoder.finish()]);
    let mut rows = Vec::new();
    for (readback, size) in readbacks {
        rows.extend(readback.read(gpu, size).await?);
    }
    gpu.check_faults()?;
    Ok(rows)
}

/// Writes `rows` (as `read_rows` returns them for `n` tokens) into the caches.
pub fn write_rows(gpu: &Gpu, caches: &[KvCache], n: usize, rows: &[u8]) {
    let mut at = 0;
    for cache in caches {
        for tensor in [&cache.k, &cache.v] {
            for (offset, size) in head_ranges(cache, n) {
                let size = size as usize;
                gpu.write(&tensor.buffer, offset, &rows[at..at + size]);
                at += size;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: KvLayout = KvLayout { n_layers: 2, n_kv_heads: 1, head_dim: 2 };

    fn snapshot(tokens: &[u32]) -> Vec<u8> {
        let rows: Vec<u8> = (0..LAYOUT.row_bytes(tokens.len())).map(|i| i as u8).collect();
        encode("key", LAYOUT, tokens, &rows)
    }

    #[test]
    fn decodes_what_it_encodes() {
        let bytes = snapshot(&[5, 6, 7]);
        let s = decode(&bytes, "key", LAYOUT, 10, 16).unwrap();
        assert_eq!(s.tokens, [5, 6, 7]);
        assert_eq!(s.rows.len(), LAYOUT.row_bytes(3));
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
            assert!(decode(&changed, "key", LAYOUT, 10, 16).is_err(), "byte {i} changed was accepted");
            assert!(decode(&bytes[..i], "key", LAYOUT, 10, 16).is_err(), "truncated to {i} bytes was accepted");
        }
    }

    #[test]
    fn refuses_another_model_or_shape() {
        let bytes = snapshot(&[5, 6]);
        let code = |r: Result<Snapshot, ModelError>| r.map(|_| ()).unwrap_err().code();
        assert_eq!(code(decode(&bytes, "other", LAYOUT, 10, 16)), "bad_snapshot");
        assert_eq!(code(decode(&bytes, "key", KvLayout { head_dim: 4, ..LAYOUT }, 10, 16)), "bad_snapshot");
        // Token 6 is outside a 6-token vocabulary; 2 tokens leave no room in a 2-token context.
        assert_eq!(code(decode(&bytes, "key", LAYOUT, 6, 16)), "bad_snapshot");
        assert_eq!(code(decode(&bytes, "key", LAYOUT, 10, 2)), "bad_snapshot");
    }
}
