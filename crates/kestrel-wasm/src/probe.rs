//! The header probe (`estimate()` and `createEngine`'s check before a download) and the
//! streamed sha256 check of a model file: what the worker asks before and while a model loads.

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
/// A split model's shards' headers are read one after another (`nextShard`).
#[wasm_bindgen]
pub struct HeaderProbe {
    /// The current file's.
    reader: GgufStreamReader,
    /// The headers of a split model's earlier shards.
    shards: Vec<GgufHeader>,
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
        HeaderProbe { reader: GgufStreamReader::new(), shards: Vec::new() }
    }

    /// The model's shards, from its first file's header (1 for a whole model). A bad split key
    /// is a `bad_model` error.
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
    /// type}], cpu: {bytes, weight_bytes, kv_cache_bytes, scratch_bytes, engine_bytes,
    /// memory_limit, fits, code, reason}, memory_limit: {bytes, source}, fits, code, reason}` for
    /// the engine `options` (JSON, as `Engine.create` takes them: `slots` KV caches of
    /// `context_length` tokens of `kv_cache` values, with their defaults). The GPU verdict is
    /// against the adapter limits given (absent: `fits` is null) and what the GPU can plausibly
    /// hold, judged from `device_memory` (`navigator.deviceMemory`, GiB; absent where the browser
    /// has none); the CPU backend's against 32-bit wasm memory. An encoder the GPU would not run
    /// (`cpu_only` says why) has the CPU backend's verdict for both.
    pub fn estimate(
        &self,
        options: &str,
        max_buffer_size: Option<f64>,
        max_binding: Option<f64>,
        device_memory: Option<f64>,
    ) -> Result<JsValue, JsValue> {
        let current = self.reader.header().ok_or_else(|| js_error("bad_model", "the GGUF header has not arrived yet"))?;
        // A split model's, as one file's (every shard's header must have arrived).
        let merged;
        let header = if self.shards.is_empty() && ShardInfo::of(current).map_err(|e| model_error(&e.into()))?.is_none() {
            current
        } else {
            let mut all = self.shards.clone();
            all.push(current.clone());
            merged = merge_headers(&all).map_err(|e| model_error(&e.into()))?;
            &merged
        };
        let settings = EngineOptions::parse(options).and_then(|o| o.settings()).map_err(|e| engine_error(&e))?;
        let (context, kv, slots) = (settings.load.context_length, settings.load.kv_cache, settings.slots);
        let estimate = Estimate::from_header(header, context, kv, slots).map_err(|e| model_error(&e))?;
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
