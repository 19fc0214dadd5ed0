//! Feeds arbitrary bytes to the GGUF stream reader in arbitrary chunk sizes, and to the
//! one-shot parser. Any error is fine; a panic, hang or huge allocation is a bug.
//! Run: cargo +nightly fuzz run gguf_stream (from this folder).
#![no_main]

use kestrel_gguf::{parse_header, GgufStreamReader, StreamEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunking, so the fuzzer explores chunk boundaries too.
    let Some((&seed, file)) = data.split_first() else {
        return;
    };
    let _ = parse_header(file);

    let mut reader = GgufStreamReader::new();
    let mut on_event = |event: StreamEvent<'_>| {
        if let StreamEvent::Tensor { info, bytes, .. } = event {
            assert_eq!(bytes.len() as u64, info.n_bytes());
        }
        Ok(())
    };
    let mut rest = file;
    let mut step = usize::from(seed);
    while !rest.is_empty() {
        // Chunk sizes cycle through 1..=64 starting from the seed.
        let n = (step % 64 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        step = step.wrapping_mul(31).wrapping_add(7);
        if reader.push(chunk, &mut on_event).is_err() {
            return;
        }
    }
    let _ = reader.finish();
});
