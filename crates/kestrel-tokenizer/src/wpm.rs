//! WordPiece (`tokenizer.ggml.model = "bert"`) as llama.cpp's `llm_tokenizer_wpm_session` does
//! it, on a vocabulary in llama.cpp's phantom-space form: a piece that starts a word is stored as
//! `▁word`, a continuation (`##ing` in BERT's vocab.txt) as `ing`, and bracketed tokens
//! (`[CLS]`, `[unused0]`) as they are.
//!
//! Text is split into words by the BERT rules (see [`Wpm::words`]), then each word, with `▁`
//! in front, is covered by the longest vocabulary pieces from left to right; a word that cannot
//! be covered is one unknown token.

use std::collections::HashMap;

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
// The `tokenizers` map type WordPiece's builder takes (it exports it under BPE only).
use tokenizers::models::bpe::Vocab as HfVocab;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;

use crate::error::{Result, TokenizerError};
use crate::unicode::{class, is_chinese, nfd_first, to_lower, CharClass};

/// The word-start marker llama.cpp's converter puts in front of every piece that starts a word.
const PHANTOM_SPACE: char = '▁';

/// A WordPiece encoder over a phantom-space vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Wpm {
    /// Piece text to id. Where two ids share a text the last wins, as in llama.cpp's
    /// `token_to_id` (filled in id order).
    by_text: HashMap<String, u32>,
    /// Longest piece in bytes: no longer match is tried.
    max_piece_len: usize,
    /// What an uncoverable word becomes.
    unk: Option<u32>,
    /// `tokenizer.ggml.normalizer.lowercase`.
    lowercase: bool,
    /// `tokenizer.ggml.normalizer.strip_accents` (llama.cpp's default: as `lowercase`).
    strip_accents: bool,
}

impl Wpm {
    pub fn new(tokens: &[String], unk: Option<u32>, lowercase: bool, strip_accents: bool) -> Self {
        let mut by_text = HashMap::with_capacity(tokens.len());
        let mut max_piece_len = 0;
        for (id, t) in tokens.iter().enumerate() {
            // llama.cpp renames an empty token `[EMPTY_i]`; no text can match it here either way.
            if t.is_empty() {
                continue;
            }
            by_text.insert(t.clone(), id as u32);
            max_piece_len = max_piece_len.max(t.len());
        }
        Wpm { by_text, max_piece_len, unk, lowercase, strip_accents }
    }

    /// The id of a piece by its stored text.
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Appends the ids of `text` (a fragment between special tokens) to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut word1 = String::new();
        for word in self.words(text) {
            word1.clear();
            word1.push(PHANTOM_SPACE);
            word1.push_str(&word);
            let start = out.len();
            let mut i = 0;
            while i < word1.len() {
                match self.longest_piece(&word1, i) {
                    Some((id, end)) => {
                        out.push(id);
                        i = end;
                    }
                    None => {
                        // One piece missing: the whole word is unknown.
                        out.truncate(start);
                        break;
                    }
                }
            }
            if out.len() == start {
                let unk = self
                    .unk
                    .ok_or_else(|| TokenizerError::Encode(format!("`{word}` is not in the vocabulary, which has no unknown token")))?;
                out.push(unk);
            }
        }
        Ok(())
    }

    /// The longest piece of the vocabulary at byte `i` of `word` (a char boundary) and where it ends.
    fn longest_piece(&self, word: &str, i: usize) -> Option<(u32, usize)> {
        let limit = word.len().min(i + self.max_piece_len);
        (i + 1..=limit)
            .rev()
            .filter(|&j| word.is_char_boundary(j))
            .find_map(|j| word.get(i..j).and_then(|s| self.token_to_id(s)).map(|id| (id, j)))
    }

    /// llama.cpp's `preprocess`: with accents stripped, each character becomes the first code point
    /// of its decomposition and marks are dropped; NUL, U+FFFD and control characters are dropped;
    /// characters are lowercased when asked; whitespace ends a word; punctuation, ASCII symbols and
    /// CJK ideographs are words of their own.
    pub fn words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for c in text.chars() {
            let c = if self.strip_accents { nfd_first(c) } else { c };
            let cls = class(c);
            if cls == CharClass::Whitespace {
                if words.last().is_some_and(|w| !w.is_empty()) {
                    words.push(String::new());
                }
                continue;
            }
            if c == '\0' || c == '\u{FFFD}' || cls == CharClass::Control || (self.strip_accents && cls == CharClass::Mark) {
                continue;
            }
            let lower = if self.lowercase { to_lower(c) } else { c };
            let alone = cls == CharClass::Punctuation || (cls == CharClass::Symbol && (c as u32) < 0x7F) || is_chinese(c);
            if alone {
                if words.last().is_some_and(|w| !w.is_empty()) {
                    words.push(String::new());
                }
                if let Some(w) = words.last_mut() {
                    w.push(lower);
                }
                words.push(String::new());
            } else if let Some(w) = words.last_mut() {
                w.push(lower);
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }

    /// The Hugging Face equivalent (BERT's normalizer and pre-tokenizer, WordPiece with `##`
    /// continuations), for `tokenizer.json` export: the vocabulary goes back to vocab.txt's form.
    /// It is close, not identical: Hugging Face's accent stripping keeps Hangul syllables whole,
    /// treats every ASCII symbol as punctuation and makes words over 100 characters unknown.
    pub fn to_hf(&self, tokens: &[String]) -> Result<tokenizers::Tokenizer> {
        let mut vocab = HfVocab::default();
        for (id, t) in tokens.iter().enumerate() {
            let text = if t.starts_with('[') && t.ends_with(']') {
                t.clone()
            } else if let Some(word) = t.strip_prefix(PHANTOM_SPACE) {
                word.to_string()
            } else {
                format!("##{t}")
            };
            vocab.insert(text, id as u32);
        }
        let mut builder = WordPiece::builder().vocab(vocab).continuing_subword_prefix("##".into());
        if let Some(unk) = self.unk.and_then(|id| tokens.get(id as usize)) {
            builder = builder.unk_token(unk.clone());
        }
        let model = builder.build().map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut hf = tokenizers::Tokenizer::new(model);
        hf.with_normalizer(Some(BertNormalizer::new(true, true, Some(self.strip_accents), self.lowercase)));
        hf.with_pre_tokenizer(Some(BertPreTokenizer));
        hf.with_decoder(Some(WordPieceDecoder::new("##".into(), true)));
        Ok(hf)
    }
}

/// llama.cpp's `clean_up_tokenization_spaces` for WordPiece detokenization, on the joined pieces:
/// drops the space before `?!.,`, joins a lone apostrophe between spaces to both neighbours, and the
/// space before `'s`, `'m`, `'re` and `'ve`.
pub(crate) fn clean_spaces(text: &mut Vec<u8>) {
    // First pass: " ?", " !", " .", " ,".
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Second pass: " ' " becomes "'". llama.cpp marks the skipped following space with NUL in its
    // buffer, so the character after it does not see a space before it.
    let mut src = std::mem::take(&mut out);
    let n = src.len();
    let mut i = 0;
    while i < n {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < n && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            out.push(x);
            src[i + 1] = 0;
            i += 2;
        } else {
            out.push(x);
            i += 1;
        }
    }
    // Third pass: " 's", " 'm", " 're", " 've" lose the space.
    let src = std::mem::take(&mut out);
    let n = src.len();
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = src[i + 1];
            let x2 = src.get(i + 2).copied();
            if matches!(x1, b's' | b'm') || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))) {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleaned(s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        clean_spaces(&mut b);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn clean_spaces_as_llama_cpp() {
        assert_eq!(cleaned(" hello , world ! ok ? yes ."), " hello, world! ok? yes.");
        assert_eq!(cleaned(" it 's we 're they 've i 'm"), " it's we're they've i'm");
        // " 't", " 'd" and " 'll" keep their space; a lone apostrophe joins both sides.
        assert_eq!(cleaned(" don 't we 'll i 'd"), " don 't we 'll i 'd");
        assert_eq!(cleaned(" don ' t"), " don't");
        // The space removed after a lone apostrophe is not a space before the next one.
        assert_eq!(cleaned(" a ' ' b"), " a'' b");
        assert_eq!(cleaned(""), "");
        assert_eq!(cleaned(","), ",");
    }

    #[test]
    fn words_as_llama_cpp_splits_them() {
        let wpm = Wpm::new(&[], None, true, true);
        assert_eq!(wpm.words("Héllo,WORLD!! 日本x ¼ a\u{200D}b"), ["hello", ",", "world", "!", "!", "日", "本", "x", "¼", "ab"]);
        let cased = Wpm::new(&[], None, false, false);
        assert_eq!(cased.words("Héllo e\u{301}"), ["Héllo", "e\u{301}"]);
    }
}
