//! The pre-tokenizers llama.cpp applies before byte-level BPE, keyed by the GGUF's
//! `tokenizer.ggml.pre` value (see llama.cpp `src/llama-vocab.cpp`, the
//! `tokenizer_pre == "..."` table and the `regex_exprs` of `llm_tokenizer_bpe`).
//!
//! llama.cpp runs its list of regexes one after another: each one splits every piece
//! produced by the previous one, and the text between matches is kept as pieces too.
//! That is exactly a sequence of `Split(regex, Isolated)` pre-tokenizers in the
//! `tokenizers` crate, which is how [`crate::Tokenizer`] uses these.
//!
//! Where llama.cpp had to rewrite a regex for `std::regex` (case-insensitive groups,
//! possessive quantifiers), the original Hugging Face regex is used here instead,
//! since fancy-regex supports it; both describe the same split.

use crate::error::{Result, TokenizerError};

/// GPT-2's split regex.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 (tiktoken cl100k style): digits in groups of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2: like Llama 3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families llama.cpp distinguishes (only those supported here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// `default` (and a missing `tokenizer.ggml.pre`).
    Default,
    /// `gpt-2`, `phi-2`, `mpt`, `olmo`, `jais`, `roberta-bpe`, ...
    Gpt2,
    /// `llama3`, `llama-bpe`, `llama-v3`, `falcon3`, `pixtral`, `dbrx`, `smaug-bpe`, `chatglm-bpe`, `glm4`...
    Llama3,
    /// `qwen2`, `deepseek-r1-qwen`, `stablelm2`, `megrez`.
    Qwen2,
    /// `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`.
    Smollm,
    /// `falcon`.
    Falcon,
    /// `deepseek-coder`.
    DeepseekCoder,
    /// `poro-chat`, `bloom`, `gpt3-finnish`.
    Poro,
    /// `viking`.
    Viking,
    /// `tekken` (Mistral Nemo).
    Tekken,
    /// `gpt-4o`, `llama4`.
    Gpt4o,
}

/// Every `tokenizer.ggml.pre` value accepted, for error messages.
pub(crate) const SUPPORTED_PRE_NAMES: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "gigachat",
    "mellum",
    "exaone4",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "dbrx",
    "smaug-bpe",
    "chatglm-bpe",
    "glm4",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
    "falcon",
    "deepseek-coder",
    "poro-chat",
    "bloom",
    "gpt3-finnish",
    "viking",
    "tekken",
    "gpt-4o",
    "llama4",
];

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value to its family, as llama.cpp does. `None`
    /// (key absent) means `default`, as in llama.cpp (which warns about it).
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self> {
        let Some(name) = name else {
            return Ok(Self::Default);
        };
        Ok(match name {
            "" | "default" => Self::Default,
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "gigachat" | "mellum" | "exaone4" => Self::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe"
            | "chatglm-bpe" | "glm4" => Self::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => Self::Qwen2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => Self::Smollm,
            "falcon" => Self::Falcon,
            "deepseek-coder" => Self::DeepseekCoder,
            "poro-chat" | "bloom" | "gpt3-finnish" => Self::Poro,
            "viking" => Self::Viking,
            "tekken" => Self::Tekken,
            "gpt-4o" | "llama4" => Self::Gpt4o,
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// The regexes, applied in order (see the module docs).
    pub fn regexes(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Self::Gpt2 => &[GPT2],
            Self::Llama3 => &[LLAMA3],
            Self::Qwen2 => &[QWEN2],
            Self::Smollm => &[r"\p{N}", GPT2],
            Self::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            Self::DeepseekCoder => &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
            Self::Poro => &[PORO],
            Self::Viking => &[PORO, r"\p{N}"],
            Self::Tekken => &[TEKKEN],
            Self::Gpt4o => &[GPT4O],
        }
    }

    /// llama.cpp's `ignore_merges`: a whole pre-token that is itself in the
    /// vocabulary is emitted as that token without running BPE merges.
    pub fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3 | Self::Tekken)
    }

    /// llama.cpp's default for `add_bos` with this pre-tokenizer (the GGUF's
    /// `tokenizer.ggml.add_bos_token` overrides it).
    pub fn default_add_bos(self) -> bool {
        matches!(self, Self::Llama3 | Self::Tekken)
    }
}

/// The regexes llama.cpp uses for a `tokenizer.ggml.pre` value.
pub fn pre_tokenizer_regexes(pre: Option<&str>) -> Result<&'static [&'static str]> {
    Ok(PreTokenizerKind::from_gguf_name(pre)?.regexes())
}
