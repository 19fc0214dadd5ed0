//! Which tokens are special and which end generation, decided from a vocabulary exactly as
//! llama.cpp's `llama_vocab::impl::load` decides it (llama-vocab.cpp, the commit
//! tools/llama-cpp's node-llama-cpp was built from), and its split of a text around special
//! tokens (`tokenizer_st_partition`).
//!
//! llama.cpp does not trust the file's token types alone: a token whose text is on one of its
//! lists (`<|eot_id|>`, `</s>`, `<end_of_turn>`, ...) becomes a control token and ends
//! generation whatever its type, so a vocabulary whose converter marked `</s>` as a normal token
//! still stops at it and still reads the text `</s>` as that one token.

use std::collections::HashMap;

use crate::vocab::{SpecialTokenIds, TokenType};

/// llama.cpp's `llama_token_attr` bits that change what a token does here.
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

impl TokenType {
    /// The attribute llama.cpp gives a token of this `tokenizer.ggml.token_type`.
    pub(crate) fn attr(self) -> u16 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => attr::NORMAL,
            TokenType::Unknown => attr::UNKNOWN,
            TokenType::Control => attr::CONTROL,
            TokenType::UserDefined => attr::USER_DEFINED,
            TokenType::Unused => attr::UNUSED,
            TokenType::Byte => attr::BYTE,
        }
    }
}

/// Texts llama.cpp takes as the end-of-turn token when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] =
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"];
const FIM_SUF_TEXTS: &[&str] =
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"];
const FIM_MID_TEXTS: &[&str] =
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts that end generation wherever they are in a vocabulary (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// What llama.cpp derives from a vocabulary: each token's attributes, the end-of-turn token,
/// the end-of-generation set and the tokens matched in text, longest first.
#[derive(Debug, Clone)]
pub(crate) struct Specials {
    pub attrs: Vec<u16>,
    pub eot: Option<u32>,
    /// Sorted.
    pub eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first (ties by id).
    pub in_text: Vec<u32>,
}

impl Specials {
    /// `attrs` are the file's types as attributes; `by_text` maps each token text to its id;
    /// `model_name` is `general.name` (llama.cpp strips the space after every special token of
    /// a model named Phi-3).
    pub fn derive(
        texts: &[String],
        mut attrs: Vec<u16>,
        by_text: &HashMap<String, u32>,
        given: &SpecialTokenIds,
        model_name: Option<&str>,
    ) -> Self {
        fn control(id: u32, attrs: &mut [u16]) {
            if let Some(a) = attrs.get_mut(id as usize) {
                *a |= attr::CONTROL;
            }
        }
        // A token found by its text (the file named none) becomes a control token. llama.cpp
        // walks a hash map, so where a vocabulary holds two of a list's texts its pick is
        // unspecified; the list's order is the one taken here.
        let detect = |given: Option<u32>, list: &[&str], attrs: &mut [u16]| {
            given.or_else(|| {
                let id = list.iter().find_map(|t| by_text.get(*t).copied())?;
                control(id, attrs);
                Some(id)
            })
        };
        let eot = detect(given.eot, EOT_TEXTS, &mut attrs);
        let eom = detect(given.eom, EOM_TEXTS, &mut attrs);
        detect(given.fim_pre, FIM_PRE_TEXTS, &mut attrs);
        detect(given.fim_suf, FIM_SUF_TEXTS, &mut attrs);
        detect(given.fim_mid, FIM_MID_TEXTS, &mut attrs);
        let fim_pad = detect(given.fim_pad, FIM_PAD_TEXTS, &mut attrs);
        let fim_rep = detect(given.fim_rep, FIM_REP_TEXTS, &mut attrs);
        let fim_sep = detect(given.fim_sep, FIM_SEP_TEXTS, &mut attrs);

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for t in EOG_TEXTS {
            if let Some(&id) = by_text.get(*t) {
                eog.push(id);
                control(id, &mut attrs);
            }
        }
        eog.extend([given.eos, eot, eom].into_iter().flatten());
        eog.retain(|&id| (id as usize) < texts.len());
        eog.sort_unstable();
        eog.dedup();

        let text_of = |id: u32| texts.get(id as usize).map(String::as_str);
        let eog_with = |eog: &[u32], t: &str| eog.iter().copied().find(|&id| text_of(id) == Some(t));
        // Harmony (gpt-oss) and Solar Open end a turn with <|return|> / <|calls|> and use
        // <|end|> inside one, so there <|end|> is neither an end nor a control token.
        let has = |eog: &[u32], t: &str| eog_with(eog, t).is_some();
        let has_call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        if let Some(end) = eog_with(&eog, "<|end|>") {
            if has_call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
                eog.retain(|&id| id != end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // Gemma 4 and PaddleOCR: </s> is text there.
        if has(&eog, "<|tool_response>") {
            if let Some(s) = eog_with(&eog, "</s>") {
                eog.retain(|&id| id != s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        let mut in_text: Vec<u32> = (0..texts.len() as u32)
            .filter(|&id| attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 && !texts[id as usize].is_empty())
            .collect();
        in_text.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()).then(a.cmp(&b)));

        // Set after the pieces are cached in llama.cpp, so they change the split only.
        let name = model_name.unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &in_text {
                attrs[id as usize] |= attr::RSTRIP;
            }
            let mut set = |t: &str, on: bool| {
                if let Some(&id) = by_text.get(t) {
                    let a = &mut attrs[id as usize];
                    *a = if on { *a | attr::RSTRIP } else { *a & !attr::RSTRIP };
                }
            };
            set("</s>", true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, false);
            }
        }
        Specials { attrs, eot, eog, in_text }
    }

    /// `text` split around special tokens as llama.cpp splits it: each token of `in_text` in
    /// turn, longest first, cuts every occurrence out of the text fragments left by the ones
    /// before. With `parse_special` off, control and unknown tokens are left as text, while
    /// user-defined tokens are still cut out (as Hugging Face's tokenizers do).
    pub fn partition<'t>(&self, texts: &[String], text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.in_text {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let special = texts[id as usize].as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(s) if s.contains(special))) {
                continue;
            }
            let mut out = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    out.push(f);
                    continue;
                };
                while let Some(at) = rest.find(special) {
                    let mut left = &rest[..at];
                    if a & attr::LSTRIP != 0 {
                        left = left.trim_end_matches(is_c_space);
                    }
                    if !left.is_empty() {
                        out.push(Fragment::Text(left));
                    }
                    out.push(Fragment::Token(id));
                    rest = &rest[at + special.len()..];
                    if a & attr::RSTRIP != 0 {
                        rest = rest.trim_start_matches(is_c_space);
                    }
                }
                if !rest.is_empty() {
                    out.push(Fragment::Text(rest));
                }
            }
            frags = out;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp's strips use.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// A piece of a text split around special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}
