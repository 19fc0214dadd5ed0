//! Streaming, error and chat-template behaviour (on the default model's vocabulary).

use std::sync::OnceLock;

use kestrel_gguf::{Metadata, MetadataValue};
use kestrel_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, TokenizerError, Vocabulary, CHATML_TEMPLATE};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");

fn metadata() -> &'static Metadata {
    static M: OnceLock<Metadata> = OnceLock::new();
    M.get_or_init(|| {
        let bytes = std::fs::read(MODEL)
            .unwrap_or_else(|e| panic!("the default model is missing at {MODEL} ({e}): run scripts/fetch-model.sh first"));
        kestrel_gguf::parse_header(&bytes).expect("parse the GGUF header").metadata
    })
}

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf(metadata()).expect("tokenizer"))
}

/// Streams `ids`, checking no push ever returns a partial character.
fn stream(t: &Tokenizer, ids: &[u32]) -> (String, usize) {
    let mut sd = StreamDecoder::new();
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        let chunk = sd.push(t, id).unwrap();
        assert!(!chunk.contains('\u{FFFD}'), "push returned a replacement character for id {id}");
        if sd.pending_bytes() > 0 {
            held += 1;
        }
        out.push_str(&chunk);
    }
    out.push_str(&sd.finish());
    (out, held)
}

#[test]
fn stream_never_splits_a_character() {
    let t = tok();
    for text in [
        "emoji 🎉🚀 and a family 👨‍👩‍👧",
        "日本語のテキストと中文文本",
        "Ünïcödé àccents: café, naïve, Straße",
        "Привет, как дела? مرحبا بالعالم",
        "plain ascii",
    ] {
        let ids = t.encode(text, false).unwrap();
        let (streamed, held) = stream(t, &ids);
        assert_eq!(streamed, text);
        assert_eq!(streamed, t.decode(&ids).unwrap(), "stream != decode");
        if !text.is_ascii() {
            // The byte-level vocabulary splits these characters across tokens: make
            // sure the test really exercised holding bytes back.
            assert!(held > 0, "{text:?}: no token held a partial character");
            assert!(
                ids.iter().any(|&id| std::str::from_utf8(t.token_bytes(id).unwrap()).is_err()),
                "{text:?}: no token carries a partial character"
            );
        }
    }
}

#[test]
fn stream_emits_a_character_as_soon_as_it_is_complete() {
    let t = tok();
    let ids = t.encode("🎉", false).unwrap();
    assert!(ids.len() > 1, "🎉 should need several byte-level tokens, got {ids:?}");
    let mut sd = StreamDecoder::new();
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(sd.push(t, id).unwrap(), "");
    }
    assert_eq!(sd.push(t, ids[ids.len() - 1]).unwrap(), "🎉");
    assert_eq!(sd.finish(), "");
}

#[test]
fn stream_finish_flushes_an_incomplete_tail_lossily() {
    let t = tok();
    let ids = t.encode("a🎉", false).unwrap();
    let cut = &ids[..ids.len() - 1]; // drop the token completing the emoji
    let mut sd = StreamDecoder::new();
    let mut out = String::new();
    for &id in cut {
        out.push_str(&sd.push(t, id).unwrap());
    }
    assert_eq!(out, "a");
    let tail = sd.finish();
    assert_eq!(tail, "\u{FFFD}");
    out.push_str(&tail);
    assert_eq!(out, t.decode(cut).unwrap(), "stream + finish == decode, even when cut");
    // finish() resets: the decoder can be reused.
    assert_eq!(sd.push(t, ids[0]).unwrap(), "a");
}

#[test]
fn out_of_range_ids_are_errors() {
    let t = tok();
    let n = t.vocab_size() as u32;
    for bad in [n, n + 1, u32::MAX] {
        assert!(matches!(
            t.decode(&[1, bad]),
            Err(TokenizerError::IdOutOfRange { id, vocab_size }) if id == bad && vocab_size == n as usize
        ));
        assert!(t.piece(bad).is_none());
        assert!(t.token_bytes(bad).is_err());
        let mut sd = StreamDecoder::new();
        assert!(matches!(sd.push(t, bad), Err(TokenizerError::IdOutOfRange { .. })));
    }
    assert!(t.decode(&[n - 1]).is_ok());
    let msg = t.decode(&[n]).unwrap_err().to_string();
    assert!(msg.contains(&n.to_string()), "error names the id: {msg}");
}

fn metadata_with(key: &str, value: MetadataValue) -> Metadata {
    let mut md = metadata().clone();
    md.set(key, value);
    md
}

#[test]
fn unknown_pre_tokenizer_is_an_error_naming_it() {
    let md = metadata_with("tokenizer.ggml.pre", MetadataValue::String("no-such-pre".into()));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(matches!(&err, TokenizerError::UnsupportedPreTokenizer(p) if p == "no-such-pre"), "{err:?}");
    assert!(err.to_string().contains("no-such-pre"), "{err}");
}

#[test]
fn unknown_model_is_an_error_naming_it() {
    // `t5`: llama.cpp's Unigram, which this crate does not implement.
    let md = metadata_with("tokenizer.ggml.model", MetadataValue::String("t5".into()));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(matches!(&err, TokenizerError::UnsupportedModel(m) if m == "t5"), "{err:?}");
    assert!(err.to_string().contains("`t5`"), "{err}");
    assert!(err.to_string().contains("bert (WordPiece)"), "{err}");
}

#[test]
fn bad_metadata_is_an_error_not_a_panic() {
    // Wrong type for the token list.
    let md = metadata_with("tokenizer.ggml.tokens", MetadataValue::U32(7));
    assert!(Tokenizer::from_gguf(&md).is_err());
    // Token types of the wrong length.
    let md = metadata_with("tokenizer.ggml.token_type", MetadataValue::Array(vec![MetadataValue::I32(1); 3]));
    assert!(matches!(Tokenizer::from_gguf(&md), Err(TokenizerError::InvalidVocabulary(_))));
    // A merge naming tokens that do not exist.
    let mut v = Vocabulary::from_metadata(metadata()).unwrap();
    v.merges.push("nosuch tokenpair".into());
    assert!(matches!(Tokenizer::from_vocabulary(&v), Err(TokenizerError::Build(_))));
    let mut v = Vocabulary::from_metadata(metadata()).unwrap();
    v.merges[0] = "nospace".into();
    assert!(matches!(Tokenizer::from_vocabulary(&v), Err(TokenizerError::InvalidVocabulary(_))));
    // No model key.
    let mut v = Vocabulary::from_metadata(metadata()).unwrap();
    v.tokens.clear();
    assert!(Tokenizer::from_vocabulary(&v).is_err());
}

#[test]
fn any_string_encodes_without_panicking() {
    let t = tok();
    let long = "a".repeat(100_000);
    for text in [
        "",
        "\0\u{1}\u{7f}",
        "\u{FFFD}\u{FEFF}\u{200B}",
        "<|im_start|><|im_start|><|im_end",
        "<|im_start|",
        "𝕳𝖊𝖑𝖑𝖔 \u{10FFFF}",
        "\r\n\r\n\t \u{a0}\u{3000}",
        long.as_str(),
    ] {
        let ids = t.encode(text, true).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
}

/// Found by fuzzing (fuzz/fuzz_targets/tokenizer.rs): SmolLM2's byte-level vocabulary has no
/// token for six control characters (U+0004, U+0006, U+0013, U+0014, U+0016, U+001D) nor for
/// the UTF-8 lead bytes 0xF1 and 0xF2 (planes 4 to 11, all unassigned). Encoding drops such a
/// byte, as the BPE model does for a symbol with no token and no unknown token, and keeps the
/// rest of the text exact.
#[test]
fn bytes_without_a_token_are_dropped_and_the_rest_round_trips() {
    let t = tok();
    let with_token = |b: u8| (0..t.vocab_size() as u32).any(|id| t.token_bytes(id).is_ok_and(|bytes| bytes == [b]));
    let missing: Vec<u8> = (0..=255).filter(|&b| !with_token(b)).collect();
    let mut expected = vec![4, 6, 19, 20, 22, 29, 192, 193, 241, 242];
    expected.extend(245..=255);
    assert_eq!(missing, expected);

    let ids = t.encode("hel\u{4}\u{4}\u{4}pful \u{1d}AI", false).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), "helpful AI");
    // U+40000 is F1 80 80 80: the lead byte goes, three lone continuation bytes stay.
    let ids = t.encode("a\u{40000}b", false).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), "a\u{FFFD}\u{FFFD}\u{FFFD}b");
}

#[test]
fn special_tokens_are_single_ids_and_eog() {
    let t = tok();
    let ids = t.encode("<|im_start|>assistant\nHi<|im_end|><|endoftext|>", false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[ids.len() - 2..], &[2, 0]);
    assert!(t.is_eog(2) && t.is_eog(0) && !t.is_eog(1));
    assert_eq!(t.token_to_id("<|im_end|>"), Some(2));
}

#[test]
fn chat_template_python_methods_and_raise_exception() {
    let tpl = ChatTemplate::new(
        "{% for m in messages %}{% if m.role not in ['user','assistant','system'] %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}\
         [{{ m.role.upper() }}]{{ m.content.strip() }}{% if m.content.startswith(' ') %}(sp){% endif %}|{% endfor %}\
         {{ bos_token }}{{ eos_token }}{% if add_generation_prompt %}>{% endif %}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let msgs = vec![ChatMessage::new("user", "  hi  "), ChatMessage::new("assistant", "yo")];
    assert_eq!(tpl.render(&msgs, true).unwrap(), "[USER]hi(sp)|[ASSISTANT]yo|<s></s>>");
    assert_eq!(tpl.render(&msgs, false).unwrap(), "[USER]hi(sp)|[ASSISTANT]yo|<s></s>");
    let err = tpl.render(&[ChatMessage::new("robot", "x")], true).unwrap_err();
    assert!(matches!(&err, TokenizerError::Template(m) if m.contains("bad role: robot")), "{err}");
}

/// Found by fuzzing (fuzz/fuzz_targets/chat_template.rs): a namespace is the one value a template
/// can change, so the one way to build a value that contains itself or grows on every turn of a
/// loop. Printing, serializing, comparing or dropping one recursed without bound and the stack
/// overflow aborted the process (in the browser: trapped the engine). vendor/minijinja refuses
/// such an assignment; each case here aborted before it. Run on a 1 MiB thread, a wasm worker's
/// stack, so that a recursion a native main thread's 8 MiB would absorb still fails the test.
#[test]
fn chat_template_namespace_cycles_and_runaway_nesting_are_template_errors() {
    let cycle = "cannot assign a value that contains the namespace";
    let deep = "nested more than 64 levels deep";
    let large = "of more than 1048576 items";
    let cases = [
        ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns %}{% endfor %}{{ ns }}", cycle),
        ("{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns|tojson }}", cycle),
        ("{% set ns = namespace(n=0) %}{% set ns.n = [ns] %}{{ ns|string }}", cycle),
        ("{% set ns = namespace(n=0) %}{% set ns.n = {'a': ns} %}{{ ns|pprint }}", cycle),
        // Two namespaces that hold each other, compared and sorted.
        ("{% set a = namespace() %}{% set b = namespace(y=a) %}{% set a.x = b %}{{ a == b }}", cycle),
        ("{% set a = namespace() %}{% set b = namespace(y=[a]) %}{% set a.x = [b] %}{{ [a, b]|sort }}", cycle),
        ("{% set a = namespace() %}{% set a.x = namespace(z=a) %}{{ a }}", cycle),
        // A value nested one level deeper, or doubled, on each turn of a loop: dropping the first
        // overflowed the stack, serializing the second ran out of memory.
        ("{% set ns = namespace(x=0) %}{% for i in range(90000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}", deep),
        ("{% set ns = namespace(x=0) %}{% for i in range(90000) %}{% set ns.x = {'a': ns.x} %}{% endfor %}{{ ns.x|tojson }}", deep),
        ("{% set ns = namespace(x=0) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|tojson }}", large),
    ];
    let handle = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || cases.map(|(src, expected)| (src, expected, hostile_render_error(src))))
        .expect("spawn a thread with a 1 MiB stack");
    for (src, expected, msg) in handle.join().expect("every render returned") {
        assert!(msg.contains(expected), "{src}: {msg}");
    }
}

/// Lazy iterables and `loop` are views that change after an assignment checks them: a namespace
/// keeps a list of what they hold at the assignment, so no cycle can form through them later.
#[test]
fn chat_template_namespace_keeps_what_a_view_holds_when_assigned() {
    let render = |src: &str| {
        let tpl = ChatTemplate::new(src, "", "").unwrap_or_else(|e| panic!("{src}: {e}"));
        tpl.render(&[ChatMessage::new("user", "hi")], false).unwrap_or_else(|e| panic!("{src}: {e}"))
    };
    assert_eq!(render("{% set ns = namespace(x=0) %}{% set ns.x = ns|items %}{{ ns|tojson }}"), r#"{"x": [["x", 0]]}"#);
    assert_eq!(
        render("{% set a = namespace(x=0) %}{% set b = namespace(x=a|items) %}{% set a.y = b %}{{ a }}"),
        r#"{"x": 0, "y": {"x": [["x", 0]]}}"#
    );
    // The first turn's loop, as it was then (a live `loop` would say 3 and 2 by now); a loop whose
    // next item is the namespace is refused.
    assert_eq!(
        render("{% set ns = namespace() %}{% for x in [1, 2, 3] %}{% if loop.first %}{% set ns.l = loop %}{% endif %}{% endfor %}{{ ns.l.index }} {{ ns.l.nextitem }}"),
        "1 2"
    );
    let tpl = ChatTemplate::new("{% set ns = namespace() %}{% for x in [1, ns] %}{% set ns.l = loop %}{% endfor %}", "", "").unwrap();
    assert!(matches!(tpl.render(&[], false), Err(TokenizerError::Template(m)) if m.contains("contains the namespace")));
    // What real templates do with namespaces still works: flags, counters, accumulated lists.
    assert_eq!(
        render("{% set ns = namespace(seen=false, n=0, msgs=[]) %}{% for m in messages %}{% set ns.seen = true %}{% set ns.n = ns.n + 1 %}{% set ns.msgs = ns.msgs + [m] %}{% endfor %}{{ ns.seen }} {{ ns.n }} {{ ns.msgs|tojson }}"),
        r#"True 1 [{"role": "user", "content": "hi"}]"#
    );
}

#[test]
fn chat_template_errors_are_errors() {
    assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TokenizerError::Template(_))));
    let tpl = ChatTemplate::new("{{ messages[5].content }}", "", "").unwrap();
    // Undefined access renders empty (lenient, like jinja2) or errors; never panics.
    let _ = tpl.render(&[], true);
}

/// Renders `src` over a short conversation and returns the template error's message; any other
/// outcome fails the test.
fn hostile_render_error(src: &str) -> String {
    let tpl = ChatTemplate::new(src, "<s>", "</s>").unwrap_or_else(|e| panic!("{src:?} should compile: {e}"));
    let msgs = [ChatMessage::new("user", "hello")];
    match tpl.render(&msgs, true) {
        Err(TokenizerError::Template(msg)) => msg,
        Err(other) => panic!("{src:?}: not a template error: {other}"),
        Ok(out) => panic!("{src:?} rendered {} bytes instead of failing", out.len()),
    }
}

#[test]
fn hostile_templates_fail_with_a_template_error() {
    // Runaway loops run out of fuel, however they are nested.
    let msg = hostile_render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    assert!(msg.contains("fuel"), "{msg}");
    let msg = hostile_render_error("{% for m in messages * 100000 %}{% for c in m.content * 100000 %}{% endfor %}{% endfor %}");
    assert!(msg.contains("fuel") || msg.contains("too large"), "{msg}");
    // Unbounded recursion, through a macro or through the template including itself, stops at the
    // recursion limit.
    let msg = hostile_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(msg.contains("recursion"), "{msg}");
    let msg = hostile_render_error("x{% include 'chat' %}");
    assert!(msg.contains("recursion"), "{msg}");
    // A huge string in one operation is refused by minijinja; many big strings written out are
    // refused by the output bound, long before they exhaust memory.
    let msg = hostile_render_error("{{ 'x' * 1000000000000 }}");
    assert!(msg.contains("too large"), "{msg}");
    let msg = hostile_render_error("{% for i in range(1000) %}{{ 'x' * 10000000 }}{% endfor %}");
    assert!(msg.contains("exceed") || msg.contains("fuel"), "{msg}");
    // Values doubled in a loop or a recursion, or many big ones made: fuel pays for the bytes of
    // the values a template makes too (vendor/minijinja), so memory is bounded with time.
    let msg = hostile_render_error("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
    assert!(msg.contains("fuel"), "{msg}");
    let msg = hostile_render_error(
        "{% macro f(n, x) %}{% if n > 0 %}{{ f(n - 1, x ~ x ~ x ~ x) }}{% endif %}{% endmacro %}{{ f(12, 'x' * 1000) }}",
    );
    assert!(msg.contains("fuel"), "{msg}");
    let msg = hostile_render_error("{% set a = 'x' * 99999999 %}{% set b = a ~ 'b' %}{% set c = a ~ 'c' %}{% set d = a ~ 'd' %}");
    assert!(msg.contains("fuel"), "{msg}");
    // Found by fuzzing: `debug()`'s dump of the state, stored in a namespace on every turn, so each
    // dump holds the last one escaped (ran 1.6 s at 16 bytes a unit of fuel; 0.4 s at 4).
    let tpl =
        ChatTemplate::new("{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = debug() %}{% endfor %}", "", "").unwrap();
    let msgs: Vec<ChatMessage> = (0..60).map(|_| ChatMessage::new("user", "")).collect();
    assert!(matches!(tpl.render(&msgs, false), Err(TokenizerError::Template(m)) if m.contains("fuel")));
    // Reading through something undefined is an error (printing an undefined name alone renders
    // nothing, as in jinja2, which real templates rely on for optional variables like `tools`).
    let msg = hostile_render_error("{{ messages[7].content.strip() }}");
    assert!(msg.contains("undefined"), "{msg}");
    assert_eq!(ChatTemplate::new("[{{ tools }}]", "", "").unwrap().render(&[], false).unwrap(), "[]");
}

#[test]
fn template_recursion_limit_fits_a_wasm_worker_stack() {
    // A wasm worker has a 1 MiB stack: the deepest recursion a template is allowed must fit in
    // it. Natively in a debug build (larger frames than wasm's release build) on a 1 MiB thread.
    let handle = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| hostile_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"))
        .expect("spawn a thread with a 1 MiB stack");
    let msg = handle.join().expect("the render returned instead of overflowing the stack");
    assert!(msg.contains("recursion"), "{msg}");
}

#[test]
fn real_template_fuel_and_output_are_far_from_the_limits() {
    // The default model's template over a long conversation stays within the bounds that stop
    // hostile templates (fuel pays for the text the template copies, too): 2,000 messages of
    // 4 KiB, 8 MB, far past any model's context.
    let tpl = ChatTemplate::for_tokenizer(tok()).unwrap();
    let msgs: Vec<ChatMessage> =
        (0..2000).map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "word ".repeat(820))).collect();
    let out = tpl.render(&msgs, true).expect("a long real conversation renders");
    assert!(out.len() > 2000 * 4096);
}

#[test]
fn chatml_fallback_and_openai_json() {
    let msgs: Vec<ChatMessage> =
        serde_json::from_str(r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]"#).unwrap();
    let out = ChatTemplate::chatml().render(&msgs, true).unwrap();
    assert_eq!(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(ChatTemplate::new(CHATML_TEMPLATE, "", "").unwrap().render(&msgs, true).unwrap(), out);
    // A model without a template falls back to ChatML.
    let mut v = Vocabulary::from_metadata(metadata()).unwrap();
    v.chat_template = None;
    let t = Tokenizer::from_vocabulary(&v).unwrap();
    assert_eq!(t.chat_template(), None);
    assert_eq!(ChatTemplate::for_tokenizer(&t).unwrap().render(&msgs, true).unwrap(), out);
}

#[test]
fn tokenizer_json_round_trip() {
    // Export the GGUF-built tokenizer as tokenizer.json and load it back with
    // from_json: same ids and text (checks the from_json path end to end).
    let t = tok();
    let json = t.to_json().unwrap();
    let j = Tokenizer::from_json(json.as_bytes()).unwrap();
    assert_eq!(j.vocab_size(), t.vocab_size());
    for text in ["<|im_start|>user\nhi 🎉 日本<|im_end|>\n", "  spaces  and 12345", "Straße"] {
        let ids = t.encode(text, true).unwrap();
        assert_eq!(j.encode(text, true).unwrap(), ids);
        assert_eq!(j.decode(&ids).unwrap(), text);
    }
    assert_eq!(j.eog_ids(), t.eog_ids());
    assert!(matches!(Tokenizer::from_json(b"{not json"), Err(TokenizerError::Json(_))));
}

/// `tojson` writes what Python's `json.dumps` writes (Hugging Face's templates): keys in their
/// order, `", "` and `": "`, `indent` as given, no HTML escaping; `tools` reaches the template.
#[test]
fn tojson_writes_as_python_and_tools_reach_the_template() {
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "description": "a < b & c", "parameters": {"z": 1, "a": [1, 2]}}}]);
    let tpl = ChatTemplate::new("{% for t in tools %}{{ t | tojson }}|{{ t.function.parameters | tojson(indent=2) }}{% endfor %}", "", "")
        .unwrap();
    let text = tpl.render_with_tools(&[], Some(&tools), false).unwrap();
    assert_eq!(
        text,
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"a < b & c\", \"parameters\": {\"z\": 1, \"a\": [1, 2]}}}|{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}"
    );
}
