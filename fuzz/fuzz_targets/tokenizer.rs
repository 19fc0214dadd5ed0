//! Encodes arbitrary UTF-8 with the default model's tokenizer (SmolLM2: GPT-2 byte-level
//! BPE) and decodes it back.
//!
//! Byte-level BPE normalizes nothing, and special-token text (`<|im_start|>`...) becomes the
//! special token, which decodes to that same text; but a byte has a token only if the
//! vocabulary has one, and SmolLM2's lacks 21 of the 256: six control characters (U+0004,
//! U+0006, U+0013, U+0014, U+0016, U+001D), the lead bytes 0xF1 and 0xF2 (planes 4 to 11, all
//! unassigned) and bytes no UTF-8 text holds. Encoding drops such a byte, as the BPE model does
//! for a symbol with no token and no unknown token (llama.cpp drops it too). So the
//! strongest true property, asserted here: decoding gives back exactly the text's bytes less
//! the ones with no token (then read as UTF-8, invalid sequences as U+FFFD); the text itself
//! when it has no such byte.
#![no_main]

use std::sync::OnceLock;

use kestrel_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

/// Which bytes have a token of their own (a token whose text is that one byte).
fn byte_has_token(tok: &Tokenizer) -> &'static [bool; 256] {
    static TABLE: OnceLock<[bool; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if let Ok(&[b]) = tok.token_bytes(id) {
                table[usize::from(b)] = true;
            }
        }
        table
    })
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tok = kestrel_fuzz::tokenizer();
    let ids = tok.encode(text, false).expect("encode failed");
    for &id in &ids {
        assert!((id as usize) < tok.vocab_size(), "id {id} outside the vocabulary");
    }
    let back = tok.decode(&ids).expect("decode failed");

    let has_token = byte_has_token(tok);
    let kept: Vec<u8> = data.iter().copied().filter(|&b| has_token[usize::from(b)]).collect();
    let expected = String::from_utf8_lossy(&kept);
    assert_eq!(back, expected, "decode(encode(text)) is not the text less its bytes without a token; ids {ids:?}");
});
