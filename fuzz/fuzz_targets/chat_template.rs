//! Compiles an arbitrary Jinja chat template and renders arbitrary messages with it, and
//! renders the same messages with the default model's own template. Any error is fine (a
//! template may not compile, or may `raise_exception`); a panic, stack overflow or hang is a
//! bug (the renderer's fuel bounds the work a template can ask for).
//!
//! Input: UTF-8 text split at NUL characters: the template, then role and content pairs.
#![no_main]

use kestrel_tokenizer::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

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
        // Known, not yet fixed: minijinja recurses without bound (a stack overflow) through a
        // namespace stored in itself, `{% set ns.n = ns %}{{ ns }}` (the test
        // `chat_template_namespace_cycle_overflows_the_stack` in kestrel-tokenizer). Templates
        // with a namespace are compiled but not rendered until that is fixed.
        if !template.contains("namespace") {
            let _ = t.render(&messages, add_generation_prompt);
        }
    }

    // The real template with these messages: it must render whatever the messages hold.
    let tok = kestrel_fuzz::tokenizer();
    let own = ChatTemplate::for_tokenizer(tok).expect("the default model's template compiles");
    let rendered = own.render(&messages, add_generation_prompt).expect("the default model's template renders any messages");
    for m in &messages {
        assert!(rendered.contains(m.content.as_str()), "a message's content is missing from the prompt");
    }
});
