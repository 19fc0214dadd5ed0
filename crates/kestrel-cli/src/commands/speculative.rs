//! The speculative-decoding flags of the commands that generate (`generate`, `chat`, `serve`,
//! `bench model`): prompt lookup, a draft model, and the draft's length.

use std::path::PathBuf;

use kestrel_engine::generation::speculation::SpeculativeOptions;
use kestrel_engine::Generator;
use kestrel_model::Model;

use super::coded;
use super::load::{load_with_slots, CacheArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct SpeculativeArgs {
    /// A smaller model with the same vocabulary that drafts tokens for the model to verify
    /// several at a time (speculative decoding), loaded on the model's backend.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Draft by prompt lookup: the tokens that followed the last few tokens' latest earlier
    /// occurrence in the prompt or the output (no second model; pays where the output repeats
    /// its prompt: edits, quotes, extraction).
    #[arg(long)]
    pub lookup: bool,
    /// Most tokens per draft (1 to 16; kestrel_engine's MAX_DRAFT).
    #[arg(long, default_value_t = SpeculativeOptions::default().draft_max)]
    pub draft_max: usize,
    /// A draft model stops drafting where its likeliest token's probability falls under this.
    #[arg(long, default_value_t = SpeculativeOptions::default().p_min)]
    pub draft_p_min: f32,
}

impl SpeculativeArgs {
    /// The engine's speculative options, None where neither --lookup nor --draft-model asks for
    /// speculation; checked before any model loads.
    pub fn options(&self) -> Result<Option<SpeculativeOptions>, String> {
        if !self.lookup && self.draft_model.is_none() {
            return Ok(None);
        }
        let options = SpeculativeOptions { lookup: self.lookup, draft_max: self.draft_max, p_min: self.draft_p_min };
        options.validate().map_err(coded)?;
        Ok(Some(options))
    }

    /// The draft model, loaded as the model was (`cache`'s backend and KV cache, `slots` slots)
    /// with the model's `context`: it runs every position the model does.
    pub fn load_draft(
        &self,
        cache: &CacheArgs,
        quiet: bool,
        slots: usize,
        context: usize,
    ) -> Result<Option<Model>, Box<dyn std::error::Error>> {
        let cache = CacheArgs { context: Some(context), ..cache.clone() };
        self.draft_model.as_ref().map(|path| load_with_slots(path, &cache, quiet, slots).map(|l| l.model)).transpose()
    }

    /// Sets `generator`'s speculative decoding to `options` (from `options()`), loading the draft
    /// model as the model was loaded; nothing for None.
    pub fn apply(
        &self,
        options: Option<SpeculativeOptions>,
        generator: &mut Generator,
        cache: &CacheArgs,
        quiet: bool,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let Some(options) = options else { return Ok(()) };
        let draft = self.load_draft(cache, quiet, generator.slots(), generator.model().context_length())?;
        generator.set_speculation(options, draft).map_err(coded)?;
        Ok(())
    }
}
