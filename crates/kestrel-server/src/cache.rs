//! The exact-response cache: deterministic requests (greedy, or sampled with a fixed seed) give
//! the same tokens every time, so the same model, prompt and options get the stored answer
//! without running the model. Least recently used entries go first, bounded in bytes.

use std::sync::{Arc, Mutex};

use kestrel_engine::openai::Endpoint;
use kestrel_engine::Generation;
use kestrel_engine::Request;
use lru::LruCache;
use serde_json::json;

pub struct ResponseCache {
    entries: Mutex<Entries>,
    capacity_bytes: usize,
}

struct Entries {
    lru: LruCache<String, Arc<Generation>>,
    bytes: usize,
}

/// The key of a request whose answer is deterministic; `None` for one that samples from the
/// clock's seed. The options are in their parsed (canonical) form, so spelling differences in
/// the JSON (field order, `null` for absent) map to the same key.
pub fn key(endpoint: Endpoint, request: &Request) -> Option<String> {
    let options = &request.options;
    if !(options.is_greedy() || options.seed.is_some()) {
        return None;
    }
    Some(json!({ "endpoint": endpoint.label(), "prompt": request.prompt, "messages": request.messages, "options": options }).to_string())
}

impl ResponseCache {
    pub fn new(capacity_bytes: usize) -> Self {
        Self { entries: Mutex::new(Entries { lru: LruCache::unbounded(), bytes: 0 }), capacity_bytes }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Generation>> {
        self.entries.lock().ok()?.lru.get(key).cloned()
    }

    /// Stores an answer, evicting the least recently used ones until it fits; one larger than
    /// the whole cache is not stored. Returns the cache's size in bytes.
    pub fn put(&self, key: String, generation: Arc<Generation>) -> usize {
        let Ok(mut entries) = self.entries.lock() else { return 0 };
        let size = entry_bytes(&key, &generation);
        if size > self.capacity_bytes {
            return entries.bytes;
        }
        if let Some(old) = entries.lru.pop(&key) {
            entries.bytes -= entry_bytes(&key, &old);
        }
        while entries.bytes + size > self.capacity_bytes {
            match entries.lru.pop_lru() {
                Some((k, g)) => entries.bytes -= entry_bytes(&k, &g),
                None => break,
            }
        }
        entries.bytes += size;
        entries.lru.put(key, generation);
        entries.bytes
    }
}

/// What an entry holds: its key, text, token ids and log-probabilities.
fn entry_bytes(key: &str, g: &Generation) -> usize {
    let ids = (g.prompt_tokens.len() + g.tokens.len()) * 4;
    // Each step: its token and logprob, its bytes, and each alternative's id, logprob and bytes.
    let logprobs: usize =
        g.logprobs.iter().map(|l| 8 + l.bytes.len() + l.top.len() * 8 + l.top_bytes.iter().map(|b| b.len() + 24).sum::<usize>()).sum();
    key.len() + g.text.len() + ids + logprobs + std::mem::size_of::<Generation>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_engine::{FinishReason, Timings};

    fn generation(text: &str) -> Arc<Generation> {
        Arc::new(Generation {
            prompt_tokens: vec![1, 2, 3],
            tokens: vec![4, 5],
            text: text.into(),
            finish_reason: FinishReason::Stop,
            timings: Timings::default(),
            logprobs: Vec::new(),
            tool_calls: Vec::new(),
            speculative: None,
        })
    }

    #[test]
    fn only_deterministic_requests_have_keys_and_spelling_does_not_matter() {
        let parse = |json: &str| Request::parse(json).unwrap();
        assert!(key(Endpoint::Completions, &parse(r#"{"prompt": "a"}"#)).is_none(), "sampled from the clock");
        let greedy = key(Endpoint::Completions, &parse(r#"{"prompt": "a", "temperature": 0, "max_tokens": 5}"#));
        let same = key(Endpoint::Completions, &parse(r#"{"max_tokens": 5, "temperature": 0.0, "stop": null, "prompt": "a"}"#));
        assert!(greedy.is_some());
        assert_eq!(greedy, same);
        assert_ne!(greedy, key(Endpoint::Completions, &parse(r#"{"prompt": "a", "temperature": 0, "max_tokens": 6}"#)));
        assert_ne!(greedy, key(Endpoint::Chat, &parse(r#"{"prompt": "a", "temperature": 0, "max_tokens": 5}"#)));
        assert!(key(Endpoint::Completions, &parse(r#"{"prompt": "a", "seed": 3}"#)).is_some());
    }

    #[test]
    fn least_recently_used_entries_go_first_within_the_byte_bound() {
        let one = entry_bytes("k0", &generation("x"));
        let cache = ResponseCache::new(one * 2);
        cache.put("k0".into(), generation("x"));
        cache.put("k1".into(), generation("y"));
        assert!(cache.get("k0").is_some(), "k0 is now the most recently used");
        let bytes = cache.put("k2".into(), generation("z"));
        assert!(bytes <= one * 2);
        assert!(cache.get("k1").is_none(), "the least recently used entry was evicted");
        assert_eq!(cache.get("k0").map(|g| g.text.clone()).as_deref(), Some("x"));
        assert_eq!(cache.get("k2").map(|g| g.text.clone()).as_deref(), Some("z"));
        let huge = generation(&"w".repeat(one * 3));
        assert_eq!(cache.put("big".into(), huge), bytes, "an entry larger than the cache is not stored");
        assert!(cache.get("big").is_none());
        // Replacing an entry does not count it twice.
        assert_eq!(cache.put("k2".into(), generation("z")), bytes);
    }
}
