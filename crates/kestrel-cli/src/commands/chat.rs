use std::io::{BufRead, Write};
use std::path::PathBuf;

use clap::Args;
use kestrel_engine::{Generator, Prompt};
use kestrel_model::ChatMessage;

use super::generate::{generate, print_stats, SamplingArgs};
use super::load::load;
use super::speculative::SpeculativeArgs;
use super::{coded, CliResult};

#[derive(Args)]
pub struct ChatArgs {
    #[arg(long, short)]
    pub model: Option<PathBuf>,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

/// An interactive conversation: each turn is rendered with the model's chat template; the KV
/// cache of the shared prefix is reused, so a turn prefills only its new tokens.
pub fn run(args: ChatArgs) -> CliResult {
    let speculative = args.speculative.options()?;
    let loaded = load(&crate::model_path::resolve(args.model), &args.sampling.cache, false)?;
    let mut generator = Generator::new(loaded.model);
    args.speculative.apply(speculative, &mut generator, &args.sampling.cache, false)?;
    let options = args.sampling.options()?;
    let mut messages: Vec<ChatMessage> = args.system.into_iter().map(|s| ChatMessage::new("system", s)).collect();
    eprintln!("type a message and press enter; an empty line or end of input quits");
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        messages.push(ChatMessage::new("user", line.trim_end()));
        let ids = generator.encode(&Prompt::Chat(&messages)).map_err(coded)?;
        let generation = generate(&mut generator, &ids, &options, true)?;
        println!();
        print_stats(&generation, loaded.load_ms);
        messages.push(ChatMessage::new("assistant", generation.text));
    }
}
