//! Checks against llama.cpp's own output for the default model
//! (tests/data/reference/, made with llama-cpp-python; see its README).

use std::path::PathBuf;
use std::sync::OnceLock;

use kestrel_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
use serde::Deserialize;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
const REFERENCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/reference");

fn load_tokenizer() -> Tokenizer {
    let path = PathBuf::from(MODEL);
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("the default model is missing at {} ({e}): run scripts/fetch-model.sh first", path.display()));
    let header = kestrel_gguf::parse_header(&bytes).expect("parse the GGUF header");
    Tokenizer::from_gguf(&header.metadata).expect("build the tokenizer from GGUF metadata")
}

fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(load_tokenizer)
}

fn read_reference(name: &str) -> serde_json::Value {
    let path = PathBuf::from(REFERENCE_DIR).join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

#[derive(Deserialize)]
struct TokenizeCase {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn tokenize_matches_llama_cpp() {
    let t = tok();
    let reference = read_reference("tokenize.json");
    let cases: Vec<TokenizeCase> = serde_json::from_value(reference["cases"].clone()).expect("tokenize.json cases");
    assert_eq!(cases.len(), 20);
    let mut failures = Vec::new();
    for c in &cases {
        // llama_tokenize(add_special = true, parse_special = true)
        let ids = t.encode(&c.text, true).expect("encode");
        if ids != c.ids {
            failures.push(format!("{:?}\n  llama.cpp: {:?}\n  kestrel:   {:?}", c.text, c.ids, ids));
        }
        // Byte-level BPE round-trips exactly.
        assert_eq!(t.decode(&ids).expect("decode"), c.text, "decode(encode(x)) != x");
    }
    assert!(failures.is_empty(), "{} of {} differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn special_ids_match_llama_cpp() {
    let t = tok();
    let g = read_reference("greedy.json");
    let tk = &g["tokenizer"];
    assert_eq!(t.bos_id(), Some(tk["bos_id"].as_u64().unwrap() as u32));
    assert_eq!(t.eos_id(), Some(tk["eos_id"].as_u64().unwrap() as u32));
    let eog: Vec<u32> = serde_json::from_value(tk["eog_ids"].clone()).unwrap();
    assert_eq!(t.eog_ids(), eog.as_slice());
    assert!(!t.add_bos(), "the GGUF says add_bos_token = false");
    assert!(!t.add_eos());
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.piece(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(t.piece(2).as_deref(), Some("<|im_end|>"));
}

#[test]
fn chat_prompts_render_and_encode_like_llama_cpp() {
    let t = tok();
    let template = ChatTemplate::for_tokenizer(t).expect("compile the GGUF chat template");
    assert!(t.chat_template().is_some(), "the default model carries a chat template");
    let prompts = read_reference("prompts.json");
    let greedy = read_reference("greedy.json");
    let mut n_chat = 0;
    for p in prompts["prompts"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let r = greedy["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == p["id"])
            .unwrap_or_else(|| panic!("{id} missing from greedy.json"));
        let expected_text = r["prompt_text"].as_str().unwrap();
        let text = match p["kind"].as_str().unwrap() {
            "chat" => {
                n_chat += 1;
                // OpenAI-style JSON messages deserialize straight into ChatMessage.
                let messages: Vec<ChatMessage> = serde_json::from_value(p["messages"].clone()).unwrap();
                let rendered = template.render(&messages, true).expect("render");
                assert_eq!(rendered, expected_text, "{id}: rendered chat prompt differs");
                rendered
            }
            _ => {
                let raw = p["text"].as_str().unwrap().to_string();
                assert_eq!(raw, expected_text);
                raw
            }
        };
        let expected_ids: Vec<u32> = serde_json::from_value(r["prompt_ids"].clone()).unwrap();
        assert_eq!(t.encode(&text, true).unwrap(), expected_ids, "{id}: prompt ids differ");
        assert_eq!(t.encode(&text, false).unwrap(), expected_ids, "{id}: prompt ids differ (no add_special)");

        // Decoding llama.cpp's generated ids gives llama.cpp's text, and so does streaming.
        let gen: Vec<u32> = serde_json::from_value(r["greedy_ids"].clone()).unwrap();
        let expected_gen = r["greedy_text"].as_str().unwrap();
        assert_eq!(t.decode(&gen).unwrap(), expected_gen, "{id}: decoded generation differs");
        let pieces: Vec<String> = serde_json::from_value(r["greedy_pieces"].clone()).unwrap();
        for (g, p) in gen.iter().zip(&pieces) {
            assert_eq!(t.piece(*g).as_deref(), Some(p.as_str()), "{id}: piece of {g}");
        }
        let mut sd = StreamDecoder::new();
        let mut streamed = String::new();
        for &g in &gen {
            streamed.push_str(&sd.push(t, g).unwrap());
        }
        streamed.push_str(&sd.finish());
        assert_eq!(streamed, expected_gen, "{id}: streamed generation differs");
    }
    assert_eq!(n_chat, 3);
}

#[test]
fn bench_prompt_matches() {
    // 256 ids llama.cpp made from this text (add_special = true).
    let t = tok();
    let greedy = read_reference("greedy.json");
    let b = &greedy["bench_prompt"];
    let text = b["text"].as_str().unwrap();
    let expected: Vec<u32> = serde_json::from_value(b["ids"].clone()).unwrap();
    assert_eq!(expected.len(), 256);
    assert_eq!(t.encode(text, true).unwrap(), expected);
}
