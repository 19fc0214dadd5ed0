//! Feeds arbitrary bytes to the GGUF stream reader in arbitrary chunk sizes, and to the
//! one-shot parser. Any error is fine; a panic, hang or huge allocation is a bug, and so is
//! the two readers disagreeing: a header the one-shot parser reads must be the header the
//! stream reports, and every tensor the stream hands out must be that header's bytes.
//! Run: ./build.sh fuzz (see README.md, "Fuzzing").
#![no_main]

use kestrel_gguf::{parse_header, GgufHeader, GgufStreamReader, StreamEvent};
use libfuzzer_sys::fuzz_target;

/// Equality where a NaN metadata value equals itself (`==` on headers says NaN != NaN).
fn same_header(a: &GgufHeader, b: &GgufHeader) -> bool {
    let entries = |h: &GgufHeader| format!("{:?}", h.metadata.iter().collect::<Vec<_>>());
    (a.version, &a.tensors, a.alignment, a.data_start) == (b.version, &b.tensors, b.alignment, b.data_start) && entries(a) == entries(b)
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    // The last byte also picks the chunking, so the fuzzer explores chunk boundaries too
    // (the file stays whole: a seed file is parsed as it is).
    let file = data;
    let Some(&seed) = file.last() else {
        return;
    };
    let one_shot = parse_header(file);

    let mut reader = GgufStreamReader::new();
    let mut streamed: Option<GgufHeader> = None;
    let mut tensors: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut on_event = |event: StreamEvent<'_>| {
        match event {
            StreamEvent::Header(h) => {
                assert!(streamed.is_none(), "a second header event");
                streamed = Some(h.clone());
            }
            StreamEvent::Tensor { index, info, bytes } => {
                assert_eq!(bytes.len() as u64, info.n_bytes());
                tensors.push((index, bytes.to_vec()));
            }
        }
        Ok(())
    };
    let mut rest = file;
    let mut step = usize::from(seed);
    let mut failed = false;
    while !rest.is_empty() {
        // Chunk sizes cycle through 1..=64 starting from the seed.
        let n = (step % 64 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        step = step.wrapping_mul(31).wrapping_add(7);
        if reader.push(chunk, &mut on_event).is_err() {
            failed = true;
            break;
        }
    }
    let finished = !failed && reader.finish().is_ok();

    if let Ok(header) = &one_shot {
        let streamed = streamed.as_ref().expect("the stream reported no header where parse_header reads one");
        assert!(same_header(streamed, header), "the stream read another header than parse_header");
    }
    if finished {
        let header = one_shot.as_ref().expect("the stream accepted a file whose header parse_header refuses");
        assert_eq!(tensors.len(), header.tensors.len(), "the stream skipped tensors");
        for (index, bytes) in &tensors {
            let expected = header.tensor_bytes(*index, file).expect("the stream handed out a tensor the header does not hold");
            assert_eq!(bytes.as_slice(), expected, "tensor {index}: the stream's bytes differ");
        }
    }
});
