//! Compiles an arbitrary Jinja chat template and renders arbitrary messages with it, and
//! renders the same messages with the default model's own template. Any error is fine (a
//! template may not compile, or may `raise_exception`); a panic, stack overflow or hang is a
//! bug (the renderer's fuel bounds the work a template can ask for, and its depth and namespace
//! checks the stack it needs).
//!
//! Input: UTF-8 text split at NUL characters: the template, then role and content pairs.
#![no_main]

use kestrel_tokenizer::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

/// A wasm worker's stack (the browser's default for a Web Worker's wasm).
const WORKER_STACK: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.split('\0');
    let template = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let messages: Vec<ChatMessage> = rest.chunks(2).map(|m| ChatMessage::new(m[0], m.get(1).copied().unwrap_or_default())).collect();
    let add_generation_prompt = data.len() % 2 == 0;

    if let Ok(t) = ChatTemplate::new(template, "<s>", "</s>") {
        // On a wasm worker's 1 MiB stack, so that a recursion the fuzzer's 8 MiB main thread would
        // absorb, and the page's engine would not, is a crash here too.
        std::thread::scope(|scope| {
            let render = std::thread::Builder::new().stack_size(WORKER_STACK).spawn_scoped(scope, || {
                let _ = t.render(&messages, add_generation_prompt);
            });
            render.expect("spawn the render thread").join().expect("the render returned");
        });
    }

    // The real template with these messages: it must render whatever the messages hold.
    let tok = kestrel_fuzz::tokenizer();
    let own = ChatTemplate::for_tokenizer(tok).expect("the default model's template compiles");
    let rendered = own.render(&messages, add_generation_prompt).expect("the default model's template renders any messages");
    for m in &messages {
        assert!(rendered.contains(m.content.as_str()), "a message's content is missing from the prompt");
    }
});
