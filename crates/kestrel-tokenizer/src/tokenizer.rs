//! [`Tokenizer`]: llama.cpp-compatible encoding on top of the `tokenizers` crate.

use std::sync::OnceLock;

use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as DecoderSequence, strip::Strip, DecoderWrapper};
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{prepend::Prepend, replace::Replace, utils::Sequence as NormalizerSequence, NormalizerWrapper};
use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence as PreSequence, split::Split, PreTokenizerWrapper};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Result, TokenizerError};
use crate::pre::PreTokenizerKind;
use crate::vocab::{TokenType, Vocabulary, VocabularyModel};

/// Token texts llama.cpp treats as end-of-generation wherever they appear in a
/// vocabulary (`special_eog_ids` in llama-vocab.cpp).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];
/// Texts llama.cpp auto-detects as the end-of-turn token when the GGUF names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// FIM pad / repo / file-separator tokens: llama.cpp adds these to the EOG set.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// How the text of a token is turned back into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-level: each character of the token stands for one byte.
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xXX>` is a raw byte.
    SentencePiece,
}

/// A tokenizer for one model: encode text to ids and decode ids to text exactly as
/// llama.cpp does for the same GGUF file.
///
/// Special tokens (GGUF token types control, user-defined and unknown) are always
/// recognised in the input text and become single ids (llama.cpp's
/// `parse_special = true`), so a rendered chat prompt tokenizes correctly.
/// Decoding renders special tokens as their text.
#[derive(Clone)]
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    /// Bytes of each token when decoded; `None` for ids the vocabulary does not define.
    pieces: Vec<Option<Box<[u8]>>>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    /// BOS/EOS are added by this crate (GGUF) rather than by the tokenizer.json post-processor.
    manual_special: bool,
    /// Strip one leading space from the first decoded token (SentencePiece add_space_prefix).
    strip_first_space: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
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

        let (mut hf, style, add_bos_default, strip_first_space) = match v.model {
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
                (hf, PieceStyle::ByteLevel, pre.default_add_bos(), false)
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
                if let Some(unk) = v.unk.and_then(|u| v.tokens.get(u as usize)) {
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
                (hf, PieceStyle::SentencePiece, true, add_space_prefix)
            }
        };

        // Special tokens: matched as a whole in the text before any other processing.
        let specials: Vec<AddedToken> = (0..n)
            .filter(|&i| v.token_type(i).is_special_text() && !v.tokens[i].is_empty())
            .map(|i| AddedToken::from(v.tokens[i].clone(), true).normalized(false))
            .collect();
        hf.add_special_tokens(&specials);

        let pieces = (0..n).map(|i| Some(token_piece(style, v.token_type(i), &v.tokens[i]).into_boxed_slice())).collect();

        let find = |texts: &[&str]| texts.iter().find_map(|t| by_text.get(*t).copied());
        let eot = v.eot.or_else(|| find(EOT_TEXTS));
        let eom = v.eom.or_else(|| find(EOM_TEXTS));
        let mut eog: Vec<u32> = Vec::new();
        let mut add_eog = |id: Option<u32>| {
            if let Some(id) = id {
                if !eog.contains(&id) {
                    eog.push(id);
                }
            }
        };
        add_eog(find(FIM_PAD_TEXTS));
        add_eog(find(FIM_REP_TEXTS));
        add_eog(find(FIM_SEP_TEXTS));
        for t in EOG_TEXTS {
            add_eog(by_text.get(*t).copied());
        }
        add_eog(v.eos);
        add_eog(eot);
        add_eog(eom);
        eog.sort_unstable();

        let add_bos = v.add_bos.unwrap_or(add_bos_default) && v.bos.is_some();
        let add_eos = v.add_eos.unwrap_or(false) && v.eos.is_some();
        Ok(Tokenizer {
            hf,
            pieces,
            bos: v.bos,
            eos: v.eos,
            eot,
            eog,
            add_bos,
            add_eos,
            manual_special: true,
            strip_first_space,
            chat_template: v.chat_template.clone(),
        })
    }

    /// Builds the tokenizer from a Hugging Face `tokenizer.json`. BOS/EOS are then
    /// added by its post-processor; BOS/EOS ids are taken from the post-processor's
    /// template when it has one, else from well-known token texts (`<s>`, `</s>`,
    /// `<|begin_of_text|>`, `<|endoftext|>`, ...). tokenizer.json carries no chat
    /// template: set one with [`Tokenizer::with_chat_template`].
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| TokenizerError::Json(e.to_string()))?;
        let hf = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Json(e.to_string()))?;
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

        let vocab = hf.get_vocab(true);
        let added = hf.get_added_tokens_decoder();
        let n = vocab.values().copied().max().map_or(0, |m| m as usize + 1);
        if n == 0 {
            return Err(TokenizerError::Json("the vocabulary is empty".into()));
        }
        let mut pieces: Vec<Option<Box<[u8]>>> = vec![None; n];
        for (text, &id) in &vocab {
            let bytes = if let Some(a) = added.get(&id) {
                a.content.as_bytes().to_vec()
            } else {
                match style {
                    Some(s) => {
                        let ty = if s == PieceStyle::SentencePiece && is_byte_token(text) { TokenType::Byte } else { TokenType::Normal };
                        token_piece(s, ty, text)
                    }
                    None => hf.decode(&[id], false).map_err(|e| TokenizerError::Json(e.to_string()))?.into_bytes(),
                }
            };
            if let Some(slot) = pieces.get_mut(id as usize) {
                *slot = Some(bytes.into_boxed_slice());
            }
        }

        // BOS / EOS from a TemplateProcessing post-processor.
        let mut bos = None;
        let mut eos = None;
        let mut add_bos = false;
        let mut add_eos = false;
        if let Some(single) = find_template_single(&json) {
            let special_id = |item: &serde_json::Value| -> Option<u32> {
                let name = item.pointer("/SpecialToken/id")?.as_str()?;
                vocab.get(name).copied()
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
        let find = |texts: &[&str]| texts.iter().find_map(|t| vocab.get(*t).copied());
        let bos = bos.or_else(|| find(&["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"]));
        let eos = eos.or_else(|| find(&["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>"]));
        let eot = find(EOT_TEXTS);
        let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| vocab.get(*t).copied()).collect();
        for id in [eos, eot, find(EOM_TEXTS)].into_iter().flatten() {
            if !eog.contains(&id) {
                eog.push(id);
            }
        }
        eog.sort_unstable();
        Ok(Tokenizer { hf, pieces, bos, eos, eot, eog, add_bos, add_eos, manual_special: false, strip_first_space, chat_template: None })
    }

    /// The equivalent Hugging Face `tokenizer.json` (for a GGUF-built tokenizer: the
    /// vocabulary, merges, pre-tokenizer, special tokens and decoder; BOS/EOS
    /// insertion is not part of it).
    pub fn to_json(&self) -> Result<String> {
        self.hf.to_string(false).map_err(|e| TokenizerError::Json(e.to_string()))
    }

    /// Replaces the chat template (e.g. for a tokenizer.json, which has none).
    pub fn with_chat_template(mut self, template: Option<String>) -> Self {
        self.chat_template = template;
        self
    }

    /// Encodes `text`. Special-token text (`<|im_start|>`...) always becomes the
    /// special token. `add_special` adds BOS / EOS as the model asks
    /// ([`Tokenizer::add_bos`], [`Tokenizer::add_eos`]), as llama.cpp's `add_special`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.hf.encode(text, add_special && !self.manual_special).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        if add_special && self.manual_special && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.manual_special && self.add_eos {
            ids.extend(self.eos);
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
    /// as llama.cpp's `llama_detokenize` does.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let mut b = self.token_bytes(id)?;
            if i == 0 && self.strip_first_space {
                b = b.strip_prefix(b" ").unwrap_or(b);
            }
            bytes.extend_from_slice(b);
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
        self.hf.token_to_id(text)
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
        self.eot
    }

    /// All end-of-generation ids, sorted: EOS, EOT, EOM, FIM pad/repo/separator and
    /// every token whose text llama.cpp treats as an end (`<|im_end|>`,
    /// `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>`, ...).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `encode(_, true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(_, true)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
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

/// What llama.cpp's `token_to_piece(special = true)` produces for a token.
fn token_piece(style: PieceStyle, ty: TokenType, text: &str) -> Vec<u8> {
    match ty {
        TokenType::Control | TokenType::UserDefined | TokenType::Unknown => text.as_bytes().to_vec(),
        TokenType::Normal => match style {
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
        },
        TokenType::Byte => match style {
            PieceStyle::SentencePiece => parse_byte_token(text).map(|b| vec![b]).unwrap_or_default(),
            PieceStyle::ByteLevel => Vec::new(),
        },
        TokenType::Unused | TokenType::Undefined => Vec::new(),
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
