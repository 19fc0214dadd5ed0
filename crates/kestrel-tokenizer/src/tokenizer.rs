//! [`Tokenizer`]: llama.cpp-compatible encoding on top of the `tokenizers` crate.

use std::sync::OnceLock;

use std::collections::HashMap;
use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as DecoderSequence, strip::Strip, DecoderWrapper};
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{prepend::Prepend, replace::Replace, utils::Sequence as NormalizerSequence, NormalizerWrapper};
use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence as PreSequence, split::Split, PreTokenizerWrapper};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Result, TokenizerError};
use crate::pre::PreTokenizerKind;
use crate::special::{attr, Fragment, Specials};
use crate::vocab::{SpecialTokenIds, Vocabulary, VocabularyModel};
use crate::wpm::{clean_spaces, Wpm};

/// How the text of a token is turned back into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-level: each character of the token stands for one byte.
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xXX>` is a raw byte.
    SentencePiece,
}

/// What encodes the text between special tokens.
#[derive(Clone)]
enum TextModel {
    /// A `tokenizers` pipeline (byte-level BPE, SentencePiece BPE, or a tokenizer.json).
    /// Boxed: the pipeline is large, WordPiece small.
    Hf(Box<tokenizers::Tokenizer>),
    /// llama.cpp's WordPiece, which `tokenizers`' BERT pipeline does not match exactly.
    Wpm(Wpm),
}

/// A tokenizer for one model: encode text to ids and decode ids to text exactly as
/// llama.cpp does for the same GGUF file.
///
/// Special tokens (control, user-defined and unknown, with the types llama.cpp gives them) are
/// split out of the input text first and become single ids, as llama.cpp's
/// `tokenizer_st_partition` does; [`Tokenizer::encode`] parses control tokens too (llama.cpp's
/// `parse_special = true`), so a rendered chat prompt tokenizes correctly.
/// Decoding renders special tokens as their text.
#[derive(Clone)]
pub struct Tokenizer {
    /// The vocabulary's model, without special tokens: it encodes the text between them.
    model: TextModel,
    /// Token text by id (empty for ids a tokenizer.json leaves undefined).
    texts: Vec<String>,
    specials: Specials,
    /// Bytes of each token when decoded; `None` for ids the vocabulary does not define.
    pieces: Vec<Option<Box<[u8]>>>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// WordPiece's separator (`[SEP]`).
    sep: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// What `add_special` appends: EOS when the vocabulary asks for it, SEP for WordPiece
    /// (which llama.cpp appends whatever `add_eos_token` says).
    end: Option<u32>,
    /// Strip one leading space from the first decoded token (SentencePiece add_space_prefix).
    strip_first_space: bool,
    /// llama.cpp's `clean_spaces` after decoding (WordPiece: no space before `.`, `,`, `'s`...).
    clean_spaces: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.specials.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

fn build_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(md: &kestrel_gguf::Metadata) -> Result<Self> {
        Self::from_vocabulary(&Vocabulary::from_metadata(md)?)
    }

    /// Builds the tokenizer from an already-read [`Vocabulary`].
    pub fn from_vocabulary(v: &Vocabulary) -> Result<Self> {
        let n = v.tokens.len();
        if n == 0 {
            return Err(TokenizerError::InvalidVocabulary("the vocabulary has no tokens".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::InvalidVocabulary(format!("{n} tokens is too many")));
        }
        if !v.token_types.is_empty() && v.token_types.len() != n {
            return Err(TokenizerError::InvalidVocabulary(format!("{} token types for {} tokens", v.token_types.len(), n)));
        }
        // First id wins for duplicated token texts (llama.cpp's token_to_id does the same
        // for the tokens it looks up by text).
        let mut by_text: Vocab = Vocab::default();
        for (id, t) in v.tokens.iter().enumerate() {
            by_text.entry(t.clone()).or_insert(id as u32);
        }

        let (model, style, add_bos_default, strip_first_space) = match v.model {
            VocabularyModel::Gpt2 => {
                let pre = PreTokenizerKind::from_gguf_name(v.pre.as_deref())?;
                let merges = parse_merges(&v.merges)?;
                let bpe = BPE::builder()
                    .vocab_and_merges(by_text.clone(), merges)
                    .ignore_merges(pre.ignore_merges())
                    .build()
                    .map_err(build_err)?;
                let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
                for re in pre.regexes() {
                    let split = Split::new(
                        tokenizers::pre_tokenizers::split::SplitPattern::Regex((*re).to_string()),
                        SplitDelimiterBehavior::Isolated,
                        false,
                    )
                    .map_err(build_err)?;
                    steps.push(split.into());
                }
                steps.push(ByteLevel::new(false, false, false).into());
                let mut hf = tokenizers::Tokenizer::new(bpe);
                hf.with_pre_tokenizer(Some(PreSequence::new(steps)));
                // Not used by this crate's decoding; makes `to_json` a complete tokenizer.json.
                hf.with_decoder(Some(ByteLevel::default()));
                (TextModel::Hf(Box::new(hf)), PieceStyle::ByteLevel, pre.default_add_bos(), false)
            }
            VocabularyModel::Llama => {
                if v.scores.len() != n {
                    return Err(TokenizerError::InvalidVocabulary(format!(
                        "SentencePiece vocabulary needs one score per token ({} scores for {} tokens)",
                        v.scores.len(),
                        n
                    )));
                }
                let merges = spm_merges(&v.tokens, &v.scores, &by_text);
                let mut builder = BPE::builder().vocab_and_merges(by_text.clone(), merges).byte_fallback(true);
                if let Some(unk) = v.ids.unk.and_then(|u| v.tokens.get(u as usize)) {
                    builder = builder.unk_token(unk.clone()).fuse_unk(true);
                }
                let bpe = builder.build().map_err(build_err)?;
                let add_space_prefix = v.add_space_prefix.unwrap_or(true);
                let mut norms: Vec<NormalizerWrapper> = Vec::new();
                if add_space_prefix {
                    // llama.cpp prefixes a space to every text fragment that starts the
                    // input or follows a special token; tokenizers applies the normalizer
                    // to exactly those fragments (added tokens are split out first).
                    norms.push(Prepend::new("▁".to_string()).into());
                }
                norms.push(Replace::new(" ", "▁").map_err(build_err)?.into());
                let mut hf = tokenizers::Tokenizer::new(bpe);
                hf.with_normalizer(Some(NormalizerSequence::new(norms)));
                // Hugging Face's Llama decoder (for `to_json`; decoding here does not use it).
                let mut dec: Vec<DecoderWrapper> = vec![
                    DecoderWrapper::Replace(Replace::new("▁", " ").map_err(build_err)?),
                    DecoderWrapper::ByteFallback(ByteFallback::new()),
                    DecoderWrapper::Fuse(Fuse::new()),
                ];
                if add_space_prefix {
                    dec.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
                }
                hf.with_decoder(Some(DecoderSequence::new(dec)));
                (TextModel::Hf(Box::new(hf)), PieceStyle::SentencePiece, true, add_space_prefix)
            }
            VocabularyModel::Bert => {
                let lowercase = v.lowercase.unwrap_or(false);
                let unk = v.ids.unk.filter(|&u| (u as usize) < n);
                let wpm = Wpm::new(&v.tokens, unk, lowercase, v.strip_accents.unwrap_or(lowercase));
                // Pieces decode as SentencePiece's do: `▁` is a space (llama.cpp's
                // token_to_piece shares the case), kept at the start of the text.
                (TextModel::Wpm(wpm), PieceStyle::SentencePiece, true, false)
            }
        };

        let attrs: Vec<u16> = (0..n).map(|i| v.token_type(i).attr()).collect();
        let by_text: HashMap<String, u32> = by_text.into_iter().collect();
        let specials = Specials::derive(&v.tokens, attrs, &by_text, &v.ids, v.model_name.as_deref());
        let pieces = (0..n).map(|i| Some(token_piece(style, specials.attrs[i], &v.tokens[i]).into_boxed_slice())).collect();

        let wordpiece = v.model == VocabularyModel::Bert;
        // llama.cpp's WordPiece adds [CLS] and [SEP] with `add_special` whatever the file's
        // add_bos_token / add_eos_token say.
        let (add_bos, end) = if wordpiece {
            (v.ids.bos.is_some(), v.ids.sep)
        } else {
            let add_eos = v.add_eos.unwrap_or(false) && v.ids.eos.is_some();
            (v.add_bos.unwrap_or(add_bos_default) && v.ids.bos.is_some(), v.ids.eos.filter(|_| add_eos))
        };
        Ok(Tokenizer {
            model,
            texts: v.tokens.clone(),
            specials,
            pieces,
            bos: v.ids.bos,
            eos: v.ids.eos,
            sep: v.ids.sep,
            add_bos,
            add_eos: end.is_some() && end == v.ids.eos,
            end,
            strip_first_space,
            clean_spaces: wordpiece,
            chat_template: v.chat_template.clone(),
        })
    }

    /// Builds the tokenizer from a Hugging Face `tokenizer.json`. BOS/EOS are added
    /// where its post-processor's template adds them, and taken from that template
    /// when it has one, else from well-known token texts (`<s>`, `</s>`,
    /// `<|begin_of_text|>`, `<|endoftext|>`, ...). tokenizer.json carries no chat
    /// template: set one with [`Tokenizer::with_chat_template`].
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let json_err = |e: &dyn std::fmt::Display| TokenizerError::Json(e.to_string());
        let mut json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| json_err(&e))?;
        // The added tokens are split out of the text by `Specials`, with the types llama.cpp's
        // converter gives them (special: control, else user-defined); the model without them
        // encodes the text in between.
        let mut added: Vec<(u32, String, bool)> = Vec::new();
        if let Some(list) = json.get("added_tokens").and_then(|a| a.as_array()) {
            for t in list {
                let id = t.get("id").and_then(|i| i.as_u64()).and_then(|i| u32::try_from(i).ok());
                let content = t.get("content").and_then(|c| c.as_str());
                match (id, content) {
                    (Some(id), Some(content)) => {
                        added.push((id, content.to_string(), t.get("special").and_then(|b| b.as_bool()).unwrap_or(false)))
                    }
                    _ => return Err(TokenizerError::Json(format!("an added token without an id and content: {t}"))),
                }
            }
        }
        if let Some(root) = json.as_object_mut() {
            root.insert("added_tokens".into(), serde_json::Value::Array(Vec::new()));
        }
        let hf = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).map_err(|e| json_err(&e))?).map_err(|e| json_err(&e))?;
        let decoder = json.get("decoder").cloned().unwrap_or(serde_json::Value::Null);
        let decoder_types = collect_types(&decoder);
        let byte_fallback = json.pointer("/model/byte_fallback").and_then(|b| b.as_bool()).unwrap_or(false);
        let style = if decoder_types.iter().any(|t| t == "ByteLevel") {
            Some(PieceStyle::ByteLevel)
        } else if byte_fallback || decoder_types.iter().any(|t| t == "ByteFallback" || t == "Metaspace") {
            Some(PieceStyle::SentencePiece)
        } else {
            None
        };
        let strip_first_space = decoder_types.iter().any(|t| t == "Strip" || t == "Metaspace") && style == Some(PieceStyle::SentencePiece);

        let vocab = hf.get_vocab(false);
        let n = vocab.values().chain(added.iter().map(|a| &a.0)).copied().max().map_or(0, |m| m as usize + 1);
        if n == 0 {
            return Err(TokenizerError::Json("the vocabulary is empty".into()));
        }
        let mut texts = vec![String::new(); n];
        let mut attrs = vec![0u16; n];
        for (text, &id) in &vocab {
            let byte = style == Some(PieceStyle::SentencePiece) && is_byte_token(text);
            texts[id as usize] = text.clone();
            attrs[id as usize] = if byte { attr::BYTE } else { attr::NORMAL };
        }
        for (id, content, special) in &added {
            texts[*id as usize] = content.clone();
            attrs[*id as usize] = if *special { attr::CONTROL } else { attr::USER_DEFINED };
        }
        let by_text: HashMap<String, u32> =
            texts.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(id, t)| (t.clone(), id as u32)).collect();

        // BOS / EOS from a TemplateProcessing post-processor.
        let mut bos = None;
        let mut eos = None;
        let mut add_bos = false;
        let mut add_eos = false;
        if let Some(single) = find_template_single(&json) {
            let special_id = |item: &serde_json::Value| -> Option<u32> {
                let name = item.pointer("/SpecialToken/id")?.as_str()?;
                by_text.get(name).copied()
            };
            if let Some(first) = single.first().and_then(special_id) {
                bos = Some(first);
                add_bos = true;
            }
            if single.len() > 1 {
                if let Some(last) = single.last().and_then(special_id) {
                    eos = Some(last);
                    add_eos = true;
                }
            }
        }
        let find = |texts: &[&str]| texts.iter().find_map(|t| by_text.get(*t).copied());
        let bos = bos.or_else(|| find(&["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"]));
        let eos = eos.or_else(|| find(&["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>"]));
        let specials = Specials::derive(&texts, attrs, &by_text, &SpecialTokenIds { eos, ..SpecialTokenIds::default() }, None);

        let mut pieces: Vec<Option<Box<[u8]>>> = vec![None; n];
        for (id, text) in texts.iter().enumerate() {
            if text.is_empty() {
                continue;
            }
            let a = specials.attrs[id];
            let bytes = match style {
                Some(s) => token_piece(s, a, text),
                None if a & attr::NORMAL == 0 => text.as_bytes().to_vec(),
                None => hf.decode(&[id as u32], false).map_err(|e| json_err(&e))?.into_bytes(),
            };
            pieces[id] = Some(bytes.into_boxed_slice());
        }
        Ok(Tokenizer {
            model: TextModel::Hf(Box::new(hf)),
            texts,
            specials,
            pieces,
            bos,
            eos,
            sep: None,
            add_bos,
            add_eos,
            end: eos.filter(|_| add_eos),
            strip_first_space,
            clean_spaces: false,
            chat_template: None,
        })
    }

    /// The equivalent Hugging Face `tokenizer.json` (for a GGUF-built tokenizer: the
    /// vocabulary, merges, pre-tokenizer, special tokens and decoder; BOS/EOS
    /// insertion is not part of it). A WordPiece vocabulary becomes Hugging Face's BERT
    /// pipeline with vocab.txt's `##` continuations, which tokenizes a few texts differently from
    /// llama.cpp (Hangul, ASCII symbols other than punctuation, words over 100 characters).
    pub fn to_json(&self) -> Result<String> {
        let mut hf = match &self.model {
            TextModel::Hf(hf) => hf.as_ref().clone(),
            TextModel::Wpm(wpm) => wpm.to_hf(&self.texts)?,
        };
        let added = |bits: u16| -> Vec<AddedToken> {
            self.specials
                .in_text
                .iter()
                .filter(|&&id| self.specials.attrs[id as usize] & bits != 0)
                .map(|&id| AddedToken::from(self.texts[id as usize].clone(), true).normalized(false))
                .collect()
        };
        // Hugging Face's `special` flag is what llama.cpp's converter reads back as control.
        hf.add_special_tokens(&added(attr::CONTROL | attr::UNKNOWN));
        hf.add_tokens(&added(attr::USER_DEFINED).into_iter().map(|t| t.special(false)).collect::<Vec<_>>());
        hf.to_string(false).map_err(|e| TokenizerError::Json(e.to_string()))
    }

    /// Replaces the chat template (e.g. for a tokenizer.json, which has none).
    pub fn with_chat_template(mut self, template: Option<String>) -> Self {
        self.chat_template = template;
        self
    }

    /// Encodes `text` with special-token parsing on: the text of a special token
    /// (`<|im_start|>`...) becomes that token. `add_special` adds BOS / EOS as the model
    /// asks ([`Tokenizer::add_bos`], [`Tokenizer::add_eos`]), as llama.cpp's `add_special`;
    /// for WordPiece, `[CLS]` (BOS) and `[SEP]` ([`Tokenizer::sep_id`]).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, true)
    }

    /// Encodes `text` as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// with `parse_special` off, the text of control and unknown tokens is encoded as
    /// text, while user-defined tokens are still matched.
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        for fragment in self.specials.partition(&self.texts, text, parse_special) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(t) => match &self.model {
                    TextModel::Hf(hf) => {
                        let enc = hf.encode(t, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
                        ids.extend_from_slice(enc.get_ids());
                    }
                    TextModel::Wpm(wpm) => wpm.encode(t, &mut ids)?,
                },
            }
        }
        if add_special {
            ids.extend(self.end);
        }
        Ok(ids)
    }

    /// The bytes token `id` decodes to (special tokens: their text). Byte-level and
    /// byte-fallback tokens may hold part of a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        match self.pieces.get(id as usize) {
            Some(Some(b)) => Ok(b),
            _ => Err(TokenizerError::IdOutOfRange { id, vocab_size: self.pieces.len() }),
        }
    }

    /// Decodes ids to text (invalid UTF-8, which only a broken id sequence can make,
    /// becomes U+FFFD). Special tokens are rendered as their text. For SentencePiece
    /// vocabularies the space prefixed by encoding is removed from the first token,
    /// as llama.cpp's `llama_detokenize` does; for WordPiece the text starts with the first
    /// word's space, and the spaces before `.`, `,`, `?`, `!`, `'s`, `'m`, `'re` and `'ve`
    /// and around a lone `'` are removed (llama.cpp's `clean_spaces`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let mut b = self.token_bytes(id)?;
            if i == 0 && self.strip_first_space {
                b = b.strip_prefix(b" ").unwrap_or(b);
            }
            bytes.extend_from_slice(b);
        }
        if self.clean_spaces {
            clean_spaces(&mut bytes);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The text of one token (what llama.cpp's `token_to_piece` gives with
    /// `special = true`); `None` if `id` is out of range. A token holding part of a
    /// multi-byte character shows U+FFFD: use [`crate::StreamDecoder`] for streaming.
    pub fn piece(&self, id: u32) -> Option<String> {
        let b = self.token_bytes(id).ok()?;
        Some(String::from_utf8_lossy(b).into_owned())
    }

    /// Looks up the id of a token by its exact text (as stored in the vocabulary).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        match &self.model {
            TextModel::Hf(hf) => hf.token_to_id(text),
            TextModel::Wpm(wpm) => wpm.token_to_id(text),
        }
    }

    /// Number of token ids (valid ids are `0..vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from the GGUF, else detected by text as llama.cpp does).
    pub fn eot_id(&self) -> Option<u32> {
        self.specials.eot
    }

    /// All end-of-generation ids, sorted, as llama.cpp's `special_eog_ids`: EOS, EOT,
    /// EOM, FIM pad/repo/separator and every token whose text llama.cpp treats as an
    /// end (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`, `</s>`, ...).
    pub fn eog_ids(&self) -> &[u32] {
        &self.specials.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.specials.eog.binary_search(&id).is_ok()
    }

    /// Whether `id` is a control token (llama.cpp's `LLAMA_TOKEN_ATTR_CONTROL`, which it
    /// also gives the tokens on its end-of-generation and fill-in-the-middle lists).
    pub fn is_control(&self, id: u32) -> bool {
        self.specials.attrs.get(id as usize).is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// Whether `encode(_, true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(_, true)` appends EOS. A WordPiece vocabulary appends its separator
    /// instead ([`Tokenizer::sep_id`]), which is often EOS too.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// WordPiece's separator (`[SEP]`), which `encode(_, true)` appends for such a vocabulary.
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }

    /// The GGUF's `tokenizer.chat_template`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Text of the BOS token ("" if none), for chat templates.
    pub fn bos_text(&self) -> String {
        self.bos.and_then(|id| self.piece(id)).unwrap_or_default()
    }

    /// Text of the EOS token ("" if none), for chat templates.
    pub fn eos_text(&self) -> String {
        self.eos.and_then(|id| self.piece(id)).unwrap_or_default()
    }

    pub(crate) fn strips_first_space(&self) -> bool {
        self.strip_first_space
    }
}

/// `"left right"` merge strings to pairs.
fn parse_merges(merges: &[String]) -> Result<Merges> {
    if merges.is_empty() {
        return Err(TokenizerError::InvalidVocabulary("byte-level BPE vocabulary has no tokenizer.ggml.merges".into()));
    }
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| TokenizerError::InvalidVocabulary(format!("merge {i} `{m}` has no space")))
        })
        .collect()
}

/// BPE merges equivalent to SentencePiece's score-driven merging (llama.cpp's
/// `llm_tokenizer_spm`): every way to split a vocabulary token into two vocabulary
/// tokens is a merge, ranked by the merged token's score (highest first).
fn spm_merges(tokens: &[String], scores: &[f32], by_text: &Vocab) -> Merges {
    let mut cands: Vec<(f32, u32, usize, &str, &str)> = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        if by_text.get(t.as_str()) != Some(&(id as u32)) {
            continue; // a duplicate text: the first id owns it
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        let score = if score.is_nan() { f32::NEG_INFINITY } else { score };
        for (pos, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(pos);
            if by_text.contains_key(a) && by_text.contains_key(b) {
                cands.push((score, id as u32, pos, a, b));
            }
        }
    }
    cands.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    cands.into_iter().map(|(_, _, _, a, b)| (a.to_string(), b.to_string())).collect()
}

/// GPT-2's byte <-> printable character table, inverted: char -> byte. Bytes that
/// are printable map to the same code point; the other 68 map, in increasing order,
/// to U+0100, U+0101, ...
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[u8; 68]> = OnceLock::new();
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let cp = c as u32;
    if cp < 256 {
        return if printable(cp) { Some(cp as u8) } else { None };
    }
    let table = TABLE.get_or_init(|| {
        let mut t = [0u8; 68];
        let mut k = 0;
        for b in 0u32..256 {
            if !printable(b) && k < t.len() {
                t[k] = b as u8;
                k += 1;
            }
        }
        t
    });
    table.get((cp - 256) as usize).copied()
}

fn is_byte_token(text: &str) -> bool {
    text.len() == 6 && text.starts_with("<0x") && text.ends_with('>')
}

fn parse_byte_token(text: &str) -> Option<u8> {
    if !is_byte_token(text) {
        return None;
    }
    u8::from_str_radix(text.get(3..5)?, 16).ok()
}

/// What llama.cpp's `token_to_piece(special = true)` produces for a token of attributes `a`.
fn token_piece(style: PieceStyle, a: u16, text: &str) -> Vec<u8> {
    if a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
        text.as_bytes().to_vec()
    } else if a & attr::NORMAL != 0 {
        match style {
            PieceStyle::ByteLevel => {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match byte_level_char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
                out
            }
            PieceStyle::SentencePiece => text.replace('▁', " ").into_bytes(),
        }
    } else if a & attr::BYTE != 0 && style == PieceStyle::SentencePiece {
        parse_byte_token(text).map(|b| vec![b]).unwrap_or_default()
    } else {
        Vec::new()
    }
}

/// All `"type"` values in a JSON tree (decoder sequences nest).
fn collect_types(v: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(t) = m.get("type").and_then(|t| t.as_str()) {
                    out.push(t.to_string());
                }
                for x in m.values() {
                    walk(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(v, &mut out);
    out
}

/// The `single` template of a TemplateProcessing post-processor (possibly inside a Sequence).
fn find_template_single(json: &serde_json::Value) -> Option<Vec<serde_json::Value>> {
    fn walk(v: &serde_json::Value) -> Option<Vec<serde_json::Value>> {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("TemplateProcessing") {
                    return m.get("single").and_then(|s| s.as_array()).cloned();
                }
                m.values().find_map(walk)
            }
            serde_json::Value::Array(a) => a.iter().find_map(walk),
            _ => None,
        }
    }
    walk(json.get("post_processor")?)
}
