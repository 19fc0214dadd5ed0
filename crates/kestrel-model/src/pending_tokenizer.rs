//! The tokenizer of a model being loaded, built beside the weights' conversion where there are
//! threads (natively): a 128k-token vocabulary's BPE tables take about 0.4 s to build, which
//! otherwise came before the first tensor. In wasm it is built at once.

use kestrel_tokenizer::{Tokenizer, TokenizerError, Vocabulary};

use crate::error::ModelError;

pub(crate) enum PendingTokenizer {
    /// Not started yet: the file's first header is still being checked (a file refused there
    /// builds no tokenizer).
    Waiting(Box<Vocabulary>),
    Ready(Box<Result<Tokenizer, TokenizerError>>),
    #[cfg(not(target_arch = "wasm32"))]
    Building(std::thread::JoinHandle<Result<Tokenizer, TokenizerError>>),
}

impl PendingTokenizer {
    pub(crate) fn new(vocabulary: Vocabulary) -> Self {
        PendingTokenizer::Waiting(Box::new(vocabulary))
    }

    /// Starts building the tokenizer, where it has not started.
    pub(crate) fn start(self) -> Self {
        match self {
            PendingTokenizer::Waiting(vocabulary) => Self::build(*vocabulary),
            started => started,
        }
    }

    /// Builds the tokenizer of `vocabulary`: on a thread natively (at once where none can be
    /// started), at once in wasm.
    fn build(vocabulary: Vocabulary) -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let shared = std::sync::Arc::new(vocabulary);
            let theirs = shared.clone();
            match std::thread::Builder::new().name("kestrel-tokenizer".into()).spawn(move || Tokenizer::from_vocabulary(&theirs)) {
                Ok(handle) => PendingTokenizer::Building(handle),
                Err(_) => PendingTokenizer::Ready(Box::new(Tokenizer::from_vocabulary(&shared))),
            }
        }
        #[cfg(target_arch = "wasm32")]
        PendingTokenizer::Ready(Box::new(Tokenizer::from_vocabulary(&vocabulary)))
    }

    /// The tokenizer, once built; its error is the load's.
    pub(crate) fn finish(self) -> Result<Tokenizer, ModelError> {
        match self {
            PendingTokenizer::Waiting(vocabulary) => Ok(Tokenizer::from_vocabulary(&vocabulary)?),
            PendingTokenizer::Ready(built) => Ok((*built)?),
            #[cfg(not(target_arch = "wasm32"))]
            PendingTokenizer::Building(handle) => match handle.join() {
                Ok(built) => Ok(built?),
                Err(_) => Err(TokenizerError::InvalidVocabulary("the tokenizer's build panicked".into()).into()),
            },
        }
    }
}
