//! The header probe (`estimate()` and `createEngine`'s check before a download) and the
//! streamed sha256 check of a model file: what the worker asks before and while a model loads.

use std::borrow::Cow;

use kestrel_engine::EngineOptions;
use kestrel_gguf::{merge_headers, GgufHeader, GgufStreamReader, ShardInfo};
use kestrel_model::estimate::{DeviceLimits, Estimate, MemoryLimit};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::*;

use crate::{engine_error, install_panic_hook, js_error, model_error, to_js};

/// SHA-256 of a file fed in chunks as it streams (WebCrypto's digest takes the whole file at
/// once): `createEngine`'s `sha256` check.
#[wasm_bindgen]
#[derive(Default)]
pub struct Sha256Hasher {
    hasher: Sha256,
}

#[wasm_bindgen]
impl Sha256Hasher {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Sha256Hasher {
        Sha256Hasher::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The digest in lowercase hex; the hasher starts over.
    #[wasm_bindgen(js_name = finishHex)]
    pub fn finish_hex(&mut self) -> String {
        self.hasher.finalize_reset().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Every shard's URL of the split model whose first shard is at `url` (`m-00001-of-00003.gguf`:
/// llama.cpp's naming, `kestrel_gguf::shard_names`), else undefined (a whole model's URL).
#[wasm_bindgen(js_name = shardNames)]
pub fn shard_names(url: &str) -> Option<Vec<String>> {
    kestrel_gguf::shard_names(url)
}

/// Reads a GGUF file's header as its first bytes arrive (no GPU needed), then answers whether the
/// model fits: `estimate()` in the browser package, and `createEngine`'s check before a download.
/// A split model's shards' headers are read one after another (`nextShard`), then a draft model's
/// where one loads beside it (`startDraft`).
#[wasm_bindgen]
pub struct HeaderProbe {
    /// The current file's.
    reader: GgufStreamReader,
    /// The headers of the current model's earlier shards.
    shards: Vec<GgufHeader>,
    /// The model's headers, once `startDraft` moved on to its draft model's.
    model: Option<Vec<GgufHeader>>,
}

impl Default for HeaderProbe {
    fn default() -> Self {
        Self::new()
    }
}

#[wasm_bindgen]
impl HeaderProbe {
    #[wasm_bindgen(constructor)]
    pub fn new() -> HeaderProbe {
        install_panic_hook();
        HeaderProbe { reader: GgufStreamReader::new(), shards: Vec::new(), model: None }
    }

    /// The current model's shards, from its first file's header (1 for a whole model). A bad
    /// split key is a `bad_model` error.
    #[wasm_bindgen(js_name = shardCount)]
    pub fn shard_count(&self) -> Result<u32, JsValue> {
        let first =
            self.shards.first().or(self.reader.header()).ok_or_else(|| js_error("bad_model", "the GGUF header has not arrived yet"))?;
        let info = ShardInfo::of(first).map_err(|e| model_error(&e.into()))?;
        Ok(info.map_or(1, |i| u32::from(i.count)))
    }

    /// Forgets the current file's bytes: the next pushed are its start again (a server that
    /// ignored a range request sends the whole file).
    pub fn restart(&mut self) {
        self.reader = GgufStreamReader::new();
    }

    /// Keeps the current file's header; the bytes pushed next are the next shard's, from its
    /// start.
    #[wasm_bindgen(js_name = nextShard)]
    pub fn next_shard(&mut self) -> Result<(), JsValue> {
        let header = self.reader.header().ok_or_else(|| js_error("bad_model", "the GGUF header has not arrived yet"))?.clone();
        self.shards.push(header);
        self.reader = GgufStreamReader::new();
        Ok(())
    }

    /// Keeps the model's headers (every shard's must have arrived); the bytes pushed next are its
    /// draft model's (`createEngine`'s `draftModel`), from its first file's start, which
    /// `estimate` then counts in the CPU backend's memory.
    #[wasm_bindgen(js_name = startDraft)]
    pub fn start_draft(&mut self) -> Result<(), JsValue> {
        if self.model.is_some() {
            return Err(js_error("internal", "the probe already reads a draft model"));
        }
        self.next_shard()?;
        self.model = Some(std::mem::take(&mut self.shards));
        Ok(())
    }

    /// Feeds the next bytes of the file; true once the whole header has arrived (stop then).
    /// A malformed header is a `bad_model` error.
    pub fn push(&mut self, bytes: &[u8]) -> Result<bool, JsValue> {
        if self.reader.header().is_none() {
            // Tensor data after the header is not wanted: its events are ignored.
            self.reader.push(bytes, &mut |_| Ok(())).map_err(|e| model_error(&e.into()))?;
        }
        Ok(self.reader.header().is_some())
    }

    /// `{kind, cpu_only, name, arch, file_bytes, weight_bytes, context_length, slots, kv_cache_bytes,
    /// activation_bytes, total_bytes, largest_binding: {name, bytes}, unsupported: [{tensor,
    /// type}], cpu: {bytes, weight_bytes, kv_cache_bytes, scratch_bytes, engine_bytes, draft_bytes,
    /// memory_limit, fits, code, reason}, memory_limit: {bytes, source}, fits, code, reason}` for
    /// the engine `options` (JSON, as `Engine.create` takes them: `slots` KV caches of
    /// `context_length` tokens of `kv_cache` values, with their defaults). The GPU verdict is
    /// against the adapter limits given (absent: `fits` is null) and what the GPU can plausibly
    /// hold, judged from `device_memory` (`navigator.deviceMemory`, GiB; absent where the browser
    /// has none); the CPU backend's against 32-bit wasm memory, with the draft model after
    /// `startDraft` (sized for the model's context and slots; counted on the CPU backend alone,
    /// whose memory holds the draft whichever backend verifies). An encoder the GPU would not run (`cpu_only` says why) has the CPU
    /// backend's verdict for both.
    pub fn estimate(
        &self,
        options: &str,
        max_buffer_size: Option<f64>,
        max_binding: Option<f64>,
        device_memory: Option<f64>,
    ) -> Result<JsValue, JsValue> {
        let current = self.reader.header().ok_or_else(|| js_error("bad_model", "the GGUF header has not arrived yet"))?;
        let settings = EngineOptions::parse(options).and_then(|o| o.settings()).map_err(|e| engine_error(&e))?;
        let (context, kv, slots) = (settings.load.context_length, settings.load.kv_cache, settings.slots);
        // Before `startDraft`, the current headers are the model's; after it, the draft's.
        let model = match self.model.as_deref().map(<[GgufHeader]>::split_last) {
            None => whole(&self.shards, current)?,
            Some(Some((last, earlier))) => whole(earlier, last)?,
            Some(None) => return Err(js_error("internal", "a draft model's probe without the model's header")),
        };
        let mut estimate = Estimate::from_header(&model, context, kv, slots).map_err(|e| model_error(&e))?;
        if self.model.is_some() {
            let draft = Estimate::from_header(&*whole(&self.shards, current)?, Some(estimate.context_length), kv, estimate.slots)
                .map_err(|e| model_error(&e))?;
            estimate.add_draft(&draft).map_err(|e| model_error(&e))?;
        }
        fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, JsValue> {
            serde_json::to_value(v).map_err(|e| js_error("internal", &e.to_string()))
        }
        let memory = MemoryLimit::gpu(device_memory);
        let mut value = to_value(&estimate)?;
        let verdict = match (max_buffer_size, max_binding) {
            (Some(buffer), Some(binding)) => {
                let limits = DeviceLimits { max_buffer_size: buffer as u64, max_storage_buffer_binding_size: binding as u64 };
                to_value(&estimate.verdict(&limits, &memory))?
            }
            _ => json!({ "fits": null, "code": null, "reason": null }),
        };
        if let (Some(out), Some(verdict)) = (value.as_object_mut(), verdict.as_object()) {
            out.extend(verdict.clone());
            out.insert("memory_limit".into(), to_value(&memory)?);
        }
        Ok(to_js(&value))
    }
}

/// One model's header: a whole file's (`last` alone), or a split model's merged from its shards'
/// (`earlier`, then `last`, every one of which must have arrived).
fn whole<'a>(earlier: &[GgufHeader], last: &'a GgufHeader) -> Result<Cow<'a, GgufHeader>, JsValue> {
    if earlier.is_empty() && ShardInfo::of(last).map_err(|e| model_error(&e.into()))?.is_none() {
        return Ok(Cow::Borrowed(last));
    }
    let mut all = earlier.to_vec();
    all.push(last.clone());
    Ok(Cow::Owned(merge_headers(&all).map_err(|e| model_error(&e.into()))?))
}

#[cfg(test)]
mod tests {
    use super::Sha256Hasher;

    #[test]
    fn sha256_of_chunks_is_the_digest_of_the_whole() {
        let mut h = Sha256Hasher::new();
        h.update(b"ab");
        h.update(b"c");
        // FIPS 180-2's test vector for "abc".
        assert_eq!(h.finish_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
