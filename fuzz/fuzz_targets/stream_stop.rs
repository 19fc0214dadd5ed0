//! Streams arbitrary token ids of the default model through the streaming detokenizer and
//! the stop-string matcher, exactly as generation does (`Model::generate`), with stop
//! strings that are arbitrary or cut from the generated text itself (so they do occur).
//!
//! Asserted: the decoder never holds back more than an incomplete character (3 bytes) and
//! its pieces add up to `decode(ids)`; the text let through contains no stop string and is the
//! text generated up to the first token after which it contains one, cut right before the
//! first stop string in it (all of it when no stop string ever appears). Stop strings are
//! looked for after each token, so a short stop string that completes first wins over a long
//! one that began earlier but was still incomplete.
#![no_main]

use kestrel_engine::generation::stop::StopMatcher;
use kestrel_tokenizer::StreamDecoder;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

struct Case {
    ids: Vec<u32>,
    stops: Vec<String>,
}

fn case(u: &mut Unstructured<'_>, vocab: usize) -> Result<Case> {
    let tok = kestrel_fuzz::tokenizer();
    let n = u.int_in_range(0..=64)?;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(u.int_in_range(0..=vocab as u32 - 1)?);
    }
    let mut stops = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        if u.arbitrary()? && !ids.is_empty() {
            // A stop string cut from the text of some of the ids.
            let a = u.choose_index(ids.len())?;
            let b = u.int_in_range(a..=ids.len())?;
            let text = tok.decode(&ids[a..b]).expect("ids are in range");
            let chars: Vec<char> = text.chars().collect();
            let from = u.int_in_range(0..=chars.len())?;
            let to = u.int_in_range(from..=chars.len())?;
            stops.push(chars[from..to].iter().collect());
        } else {
            stops.push(u.arbitrary()?);
        }
    }
    stops.retain(|s: &String| !s.is_empty()); // as GenerateOptions::validate requires
    Ok(Case { ids, stops })
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    let tok = kestrel_fuzz::tokenizer();
    let Ok(Case { ids, stops }) = case(&mut Unstructured::new(data), tok.vocab_size()) else {
        return;
    };
    let full = tok.decode(&ids).expect("ids are in range");

    // The decoder's pieces: one per token, then what `finish` flushes.
    let mut decoder = StreamDecoder::new();
    let mut pieces = Vec::with_capacity(ids.len() + 1);
    for &id in &ids {
        pieces.push(decoder.push(tok, id).expect("ids are in range"));
        assert!(decoder.pending_bytes() <= 3, "the decoder holds {} bytes back", decoder.pending_bytes());
    }
    pieces.push(decoder.finish());
    assert_eq!(pieces.concat(), full, "the streamed pieces are not decode(ids)");

    // The matcher, fed as Model::generate feeds it.
    let mut matcher = StopMatcher::new(&stops);
    let mut text = String::new();
    let mut stopped = false;
    for piece in &pieces {
        let out = matcher.push(piece);
        text.push_str(&out.text);
        if out.stopped {
            stopped = true;
            break;
        }
    }
    if !stopped {
        text.push_str(&matcher.finish());
    }

    // What it should give: the text so far checked after each piece.
    let mut so_far = String::new();
    let mut expected = None;
    for piece in &pieces {
        so_far.push_str(piece);
        if let Some(at) = stops.iter().filter_map(|s| so_far.find(s.as_str())).min() {
            expected = Some(&so_far[..at]);
            break;
        }
    }
    assert_eq!(stopped, expected.is_some(), "stops {stops:?}");
    assert_eq!(text, expected.unwrap_or(&full), "stops {stops:?}");
    for s in &stops {
        assert!(!text.contains(s.as_str()), "the stop string {s:?} leaked");
    }
});
