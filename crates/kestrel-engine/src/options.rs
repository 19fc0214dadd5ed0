//! The engine's options as a front end receives them (the browser package's `createEngine`
//! options, as JSON): where the model runs, its KV cache and slots, how a batched step prompts,
//! the GPU's submission budget, speculative decoding. Named, defaulted and checked here once, so
//! that a new option is a field here (and its type in `index.d.ts`), not a parser in every front
//! end.

use std::time::Duration;

use kestrel_gpu::GpuOptions;
use kestrel_model::{submit_budget_from_ms, LoadOptions, Model, ModelError, MAX_SLOTS};
use kestrel_ops::params::KvType;
use serde::Deserialize;

use crate::generation::speculation::{SpeculativeOptions, MAX_DRAFT};
use crate::{BackendPreference, EngineError, Scheduler, DEFAULT_PREFILL_CHUNK};

/// The most prompt tokens a batched step may run (a whole chunk of the largest prefill).
pub const MAX_PREFILL_CHUNK: usize = 4096;

/// The options in their wire form (absent or `null`: the default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineOptions {
    /// 'auto' (the default), 'webgpu' or 'cpu'.
    pub backend: Option<String>,
    /// What `info.backend_reason` says when the CPU backend was asked for.
    pub backend_reason: Option<String>,
    /// Optional GPU features to force off.
    pub gpu: Option<GpuFeatures>,
    /// KV cache tokens (default: the model's training context, at most 4096).
    pub context_length: Option<f64>,
    /// 'f16' (the default) or 'f32'.
    pub kv_cache: Option<String>,
    /// Requests generated at once (1 to `MAX_SLOTS`, default 1).
    pub slots: Option<f64>,
    /// Prompt tokens a batched step runs at most (1 to `MAX_PREFILL_CHUNK`, default 32).
    pub prefill_chunk: Option<f64>,
    /// GPU time one prompt submission may take, in ms (0 or absent: a whole chunk at once).
    pub submit_budget_ms: Option<f64>,
    /// Speculative decoding (absent: none).
    pub speculative: Option<Speculative>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFeatures {
    pub allow_f16: Option<bool>,
    pub allow_subgroups: Option<bool>,
    pub allow_timestamps: Option<bool>,
}

/// `speculative`: how drafts are made; a draft model comes apart (the page's `draftModel`, loaded
/// after the model). The page's casing (`maxDraft`), as its other object options have.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Speculative {
    /// Draft by prompt lookup (default false).
    pub lookup: Option<bool>,
    /// Most tokens per draft (1 to `MAX_DRAFT`, default `SpeculativeOptions::default`'s).
    #[serde(rename = "maxDraft")]
    pub max_draft: Option<f64>,
}

/// The options checked and in the engine's own types.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub preference: BackendPreference,
    /// The reason given when the CPU backend was asked for.
    pub cpu_asked: String,
    pub gpu: GpuOptions,
    /// The load's options but the slots (`load_options` adds them where the load allocates them).
    pub load: LoadOptions,
    pub slots: usize,
    pub prefill_chunk: usize,
    pub submit_budget: Option<Duration>,
    /// How the engine speculates, where it can (`Generator::set_speculation`); None: it does not.
    pub speculative: Option<SpeculativeOptions>,
}

impl EngineOptions {
    /// Parses the options from JSON; an unknown option is an `invalid_option` error naming it.
    pub fn parse(json: &str) -> Result<EngineOptions, EngineError> {
        serde_json::from_str(json).map_err(|e| EngineError::invalid("options", format!("invalid option: {e}")))
    }

    /// Checks every option and gives the engine's settings.
    pub fn settings(&self) -> Result<EngineSettings, EngineError> {
        let preference = match self.backend.as_deref() {
            None | Some("auto") => BackendPreference::Auto,
            Some("webgpu") => BackendPreference::Gpu,
            Some("cpu") => BackendPreference::Cpu,
            Some(other) => {
                return Err(EngineError::invalid(
                    "backend",
                    format!("invalid option backend: '{other}', expected 'webgpu', 'cpu' or 'auto'"),
                ))
            }
        };
        let features = self.gpu.as_ref();
        let gpu = GpuOptions {
            allow_f16: features.and_then(|f| f.allow_f16).unwrap_or(true),
            allow_subgroups: features.and_then(|f| f.allow_subgroups).unwrap_or(true),
            allow_timestamps: features.and_then(|f| f.allow_timestamps).unwrap_or(true),
            ..GpuOptions::default()
        };
        let kv_cache = match self.kv_cache.as_deref() {
            None => KvType::default(),
            Some(name) => KvType::from_name(name)
                .ok_or_else(|| EngineError::invalid("kv_cache", format!("invalid option kv_cache: '{name}', expected 'f16' or 'f32'")))?,
        };
        let context_length = self.context_length.map(|n| integer("context_length", n, 1_000_000_000)).transpose()?;
        let slots = self.slots.map_or(Ok(1), |n| integer("slots", n, MAX_SLOTS))?;
        let prefill_chunk = self.prefill_chunk.map_or(Ok(DEFAULT_PREFILL_CHUNK), |n| integer("prefill_chunk", n, MAX_PREFILL_CHUNK))?;
        let submit_budget = self.submit_budget_ms.map_or(Ok(None), submit_budget_from_ms)?;
        let speculative = self.speculative.as_ref().map(Speculative::options).transpose()?;
        Ok(EngineSettings {
            preference,
            cpu_asked: self.backend_reason.clone().unwrap_or_else(|| "backend 'cpu' was asked for".into()),
            gpu,
            load: LoadOptions { context_length, kv_cache, ..LoadOptions::default() },
            slots,
            prefill_chunk,
            submit_budget,
            speculative,
        })
    }
}

impl Speculative {
    fn options(&self) -> Result<SpeculativeOptions, EngineError> {
        let defaults = SpeculativeOptions::default();
        let draft_max = self.max_draft.map_or(Ok(defaults.draft_max), |n| integer("speculative.maxDraft", n, MAX_DRAFT))?;
        Ok(SpeculativeOptions { lookup: self.lookup.unwrap_or(false), draft_max, ..defaults })
    }
}

impl EngineSettings {
    /// The load's options on the chosen backend: the GPU allocates its slots' KV caches at load.
    pub fn load_options(&self, on_gpu: bool) -> LoadOptions {
        let slots = if on_gpu { self.slots } else { self.load.slots };
        LoadOptions { slots, ..self.load.clone() }
    }

    /// The scheduler over a model just loaded with `load_options`: the CPU backend's slots grow
    /// here, the GPU's submission budget is set, and prompts run `prefill_chunk` tokens a step.
    pub fn scheduler(&self, mut model: Model) -> Result<Scheduler, ModelError> {
        model.set_slots(self.slots)?;
        model.set_submit_budget(self.submit_budget)?;
        Ok(Scheduler::new(model, self.prefill_chunk))
    }
}

/// A whole number from 1 to `max`: JavaScript's numbers are floats.
fn integer(name: &str, n: f64, max: usize) -> Result<usize, EngineError> {
    if n.fract() == 0.0 && (1.0..=max as f64).contains(&n) {
        return Ok(n as usize);
    }
    Err(EngineError::invalid(name, format!("invalid option {name}: {n} must be an integer from 1 to {max}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(json: &str) -> Result<EngineSettings, EngineError> {
        EngineOptions::parse(json)?.settings()
    }

    #[test]
    fn defaults_and_unknown_options() {
        let Ok(d) = settings("{}") else { panic!("the defaults") };
        assert_eq!((d.preference, d.slots, d.prefill_chunk, d.submit_budget), (BackendPreference::Auto, 1, DEFAULT_PREFILL_CHUNK, None));
        assert!(d.gpu.allow_f16 && d.gpu.allow_subgroups && d.gpu.allow_timestamps);
        assert_eq!(d.load.context_length, None);
        let Ok(s) = settings(r#"{"backend": "cpu", "backend_reason": "why", "gpu": {"allow_f16": false}, "slots": null}"#) else {
            panic!("valid options")
        };
        assert_eq!(
            (s.preference, s.cpu_asked.as_str(), s.gpu.allow_f16, s.gpu.allow_subgroups, s.slots),
            (BackendPreference::Cpu, "why", false, true, 1)
        );
        // `remote` is the package's option, not the engine's: a misplaced or misspelt one is named.
        let e = settings(r#"{"remote": {}}"#).map(|_| ()).expect_err("an unknown option");
        assert!(e.code == "invalid_option" && e.message.contains("remote"), "{}", e.message);
        let e = settings(r#"{"gpu": {"allow_f32": true}}"#).map(|_| ()).expect_err("an unknown GPU feature");
        assert!(e.message.contains("allow_f32"), "{}", e.message);
    }

    #[test]
    fn bad_values_name_their_option() {
        for (json, name) in [
            (r#"{"backend": "gpu2"}"#, "backend"),
            (r#"{"slots": 0}"#, "slots"),
            (r#"{"slots": 17}"#, "slots"),
            (r#"{"slots": 1.5}"#, "slots"),
            (r#"{"prefill_chunk": 0}"#, "prefill_chunk"),
            (r#"{"kv_cache": "f8"}"#, "kv_cache"),
            (r#"{"context_length": -1}"#, "context_length"),
            (r#"{"submit_budget_ms": -3}"#, "submit_budget_ms"),
            (r#"{"speculative": {"maxDraft": 0}}"#, "speculative.maxDraft"),
            (r#"{"speculative": {"maxDraft": 17}}"#, "speculative.maxDraft"),
            (r#"{"speculative": {"maxDraft": 2.5}}"#, "speculative.maxDraft"),
            // The engine's own name is not the page's.
            (r#"{"speculative": {"draft_max": 4}}"#, "draft_max"),
        ] {
            let e = settings(json).map(|_| ()).expect_err(json);
            assert_eq!(e.code, "invalid_option", "{json}");
            assert!(e.message.contains(name), "{json}: {}", e.message);
        }
        let Ok(s) = settings(
            r#"{"backend": "webgpu", "context_length": 512, "kv_cache": "f32", "slots": 4, "prefill_chunk": 64, "submit_budget_ms": 8}"#,
        ) else {
            panic!("valid options")
        };
        assert_eq!(
            (s.preference, s.load.context_length, s.load.kv_cache, s.slots, s.prefill_chunk),
            (BackendPreference::Gpu, Some(512), KvType::F32, 4, 64)
        );
        assert_eq!(s.submit_budget, Some(Duration::from_millis(8)));
        // The GPU allocates the slots' KV caches at load; the CPU backend grows them after it.
        let (gpu, cpu) = (s.load_options(true), s.load_options(false));
        assert_eq!((gpu.slots, cpu.slots), (4, LoadOptions::default().slots));
        assert_eq!((gpu.context_length, cpu.context_length, cpu.kv_cache), (Some(512), Some(512), KvType::F32));
    }

    #[test]
    fn speculative_takes_the_engines_defaults() {
        let Ok(none) = settings("{}") else { panic!("the defaults") };
        assert_eq!(none.speculative, None);
        let Ok(lookup) = settings(r#"{"speculative": {"lookup": true, "maxDraft": 4}}"#) else { panic!("valid options") };
        assert_eq!(lookup.speculative, Some(SpeculativeOptions { lookup: true, draft_max: 4, ..SpeculativeOptions::default() }));
        // `{}`: a draft model's defaults, as llama.cpp's.
        let Ok(draft) = settings(r#"{"speculative": {}}"#) else { panic!("valid options") };
        assert_eq!(draft.speculative, Some(SpeculativeOptions::default()));
    }
}
