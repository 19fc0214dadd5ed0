//! Streaming detokenization.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Turns ids into text one token at a time, for streaming generated output.
///
/// A token may carry only part of a UTF-8 character (byte-level BPE splits emoji and
/// CJK characters across tokens; SentencePiece uses `<0xXX>` byte tokens). Those
/// bytes are held back until the character is complete, so no push ever returns a
/// broken character. Bytes that can never form a valid character are replaced with
/// U+FFFD exactly as [`Tokenizer::decode`] replaces them, so the concatenation of
/// every [`push`](Self::push) plus [`finish`](Self::finish) equals `decode(all ids)`.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    started: bool,
}

impl StreamDecoder {
    /// A decoder for a new sequence of ids (the first token is treated as the start
    /// of the text, as in [`Tokenizer::decode`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that keeps every byte of every token, the first token's leading space included
    /// (SentencePiece vocabularies otherwise strip it): for output held to a grammar, whose text
    /// must be the bytes the grammar matched.
    pub fn verbatim() -> Self {
        Self { pending: Vec::new(), started: true }
    }

    /// Adds one token; returns the text completed by it (possibly empty).
    /// Errors on an id outside the vocabulary (the decoder state is unchanged then).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        let mut bytes = tok.token_bytes(id)?;
        if !self.started && tok.strips_first_space() {
            bytes = bytes.strip_prefix(b" ").unwrap_or(bytes);
        }
        self.started = true;
        self.pending.extend_from_slice(bytes);
        Ok(self.take_complete())
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: returns what is left (an incomplete character becomes
    /// U+FFFD) and resets the decoder for a new sequence.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.started = false;
        out
    }

    /// Emits every complete character at the front of `pending`, replacing invalid
    /// sequences as `String::from_utf8_lossy` does, and keeps an incomplete tail.
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: the prefix up to valid_up_to is valid UTF-8.
                    if let Ok(s) = std::str::from_utf8(&self.pending[start..start + valid]) {
                        out.push_str(s);
                    }
                    start += valid;
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += bad;
                        }
                        None => break, // incomplete character at the end: wait for more
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}
