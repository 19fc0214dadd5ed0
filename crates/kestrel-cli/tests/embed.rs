//! `kestrel embed` and `kestrel rerank` as a script runs them: OpenAI's embeddings JSON on stdout
//! with llama.cpp's vectors (normalized), the rerank JSON with llama.cpp's scores, texts from the
//! arguments or from stdin, and a model of the other kind refused with its code.

#[path = "../../kestrel-model/tests/common/synthetic_encoder.rs"]
mod synthetic_encoder;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use base64::Engine as _;
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn embedding_model() -> String {
    repo("models/all-MiniLM-L6-v2.f32.gguf").to_str().expect("a UTF-8 path").to_owned()
}

/// llama.cpp's cases for the model: `{text, tokens, vector}`, the vectors not normalized.
fn reference() -> Vec<Value> {
    let text = std::fs::read_to_string(repo("tests/data/embeddings/minilm.json")).expect("read minilm.json");
    let value: Value = serde_json::from_str(&text).expect("minilm.json is JSON");
    value["cases"].as_array().expect("cases").clone()
}

fn floats(value: &Value) -> Vec<f64> {
    value.as_array().expect("an array of numbers").iter().map(|x| x.as_f64().expect("a number")).collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b))
}

/// Runs `kestrel embed` with `args`, `stdin` piped in.
fn embed(args: &[&str], stdin: &str) -> Output {
    kestrel("embed", args, stdin)
}

/// Runs `kestrel COMMAND` with `args`, `stdin` piped in.
fn kestrel(command: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .arg(command)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kestrel");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("wait for kestrel")
}

fn answer(out: &Output) -> Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

#[test]
fn texts_embed_as_openai_answers_with_llama_cpp_vectors() {
    let cases = reference();
    let texts: Vec<&str> = cases[..2].iter().map(|c| c["text"].as_str().expect("text")).collect();
    let model = embedding_model();
    let json = answer(&embed(&["-m", &model, texts[0], texts[1]], ""));
    assert_eq!(json["object"], "list");
    assert_eq!(json["model"], "all-MiniLM-L6-v2.f32");
    let data = json["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    for (i, (item, case)) in data.iter().zip(&cases).enumerate() {
        assert_eq!((item["object"].as_str(), item["index"].as_u64()), (Some("embedding"), Some(i as u64)));
        let vector = floats(&item["embedding"]);
        assert_eq!(vector.len(), 384);
        let cos = cosine(&vector, &floats(&case["vector"]));
        assert!(cos >= 0.999, "{:?}: cosine {cos}", case["text"]);
        assert!((norm(&vector) - 1.0).abs() < 1e-5, "unit length");
    }
    let tokens: usize = cases[..2].iter().map(|c| c["tokens"].as_array().expect("tokens").len()).sum();
    assert_eq!(json["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64));
    assert_eq!(json["usage"]["total_tokens"].as_u64(), Some(tokens as u64));
}

/// `--backend gpu` runs the encoder's layers on the GPU (lavapipe here), says so, and gives
/// llama.cpp's vectors too; `auto` on a software adapter stays on the CPU backend.
#[test]
fn backend_gpu_runs_the_layers_on_the_gpu() {
    let case = &reference()[0];
    let text = case["text"].as_str().expect("text");
    let model = embedding_model();
    let on_gpu = embed(&["-m", &model, "--backend", "gpu", text], "");
    let vector = floats(&answer(&on_gpu)["data"][0]["embedding"]);
    let loaded = String::from_utf8_lossy(&on_gpu.stderr);
    assert!(loaded.contains("loaded") && !loaded.contains(" on CPU ("), "{loaded}");
    let cos = cosine(&vector, &floats(&case["vector"]));
    assert!(cos >= 0.999, "cosine {cos} with llama.cpp's");
    let auto = embed(&["-m", &model, text], "");
    let loaded = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success() && loaded.contains(" on CPU ("), "{loaded}");
}

/// `kestrel bench embed` measures where `--backend` places the layers, and says where; a chat
/// model is refused with its code.
#[test]
fn bench_embed_runs_where_backend_says() {
    let model = embedding_model();
    let dir = std::env::temp_dir().join(format!("kestrel-bench-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (backend, device) in [("gpu", "GPU backend ("), ("cpu", "CPU backend (")] {
        let json = dir.join(format!("{backend}.json"));
        let json_arg = json.to_str().expect("utf-8 path");
        let args = ["embed", "-m", &model, "--backend", backend, "--inputs", "3", "--tokens", "8", "--repeats", "1", "--json", json_arg];
        let out = kestrel("bench", &args, "");
        assert!(out.status.success(), "{backend}: {}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("the report")).expect("JSON report");
        assert!(report["device"].as_str().is_some_and(|d| d.starts_with(device)), "{backend}: {report}");
        assert_eq!(report["inputs"], 3, "{report}");
        assert!(report["sentences_per_s"]["median"].as_f64().is_some_and(|r| r > 0.0), "{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let chat = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = kestrel("bench", &["embed", "-m", chat.to_str().expect("utf-8 path"), "--backend", "gpu"], "");
    assert!(!out.status.success() && stderr_of(&out).contains("[invalid_option]"), "{}", stderr_of(&out));
}

#[test]
fn stdin_lines_base64_and_dimensions() {
    let case = &reference()[2];
    let text = case["text"].as_str().expect("text");
    // Two lines and a blank one: two texts.
    let json = answer(&embed(&["-m", &embedding_model(), "--base64", "--dimensions", "64"], &format!("{text}\n\nHello world\n")));
    let data = json["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    let bytes = base64::engine::general_purpose::STANDARD.decode(data[0]["embedding"].as_str().expect("base64 text")).expect("base64");
    let vector: Vec<f64> = bytes.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes")))).collect();
    assert_eq!(vector.len(), 64);
    assert!((norm(&vector) - 1.0).abs() < 1e-5, "the 64 values are normalized again");
    let cos = cosine(&vector, &floats(&case["vector"])[..64]);
    assert!(cos >= 0.999, "cosine {cos}");
}

#[test]
fn chat_models_and_bad_inputs_are_refused_with_their_codes() {
    let chat = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = embed(&["-m", chat.to_str().expect("a UTF-8 path"), "Hello"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("chat model (llama)") && stderr.contains("[invalid_option]"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let model = embedding_model();
    let long = "word ".repeat(600);
    let out = embed(&["-m", &model, &long], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("[context_overflow]"), "{stderr}");
    let json = answer(&embed(&["-m", &model, "--truncate", &long], ""));
    assert_eq!(json["usage"]["prompt_tokens"].as_u64(), Some(512));
    let out = embed(&["-m", &model], "\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("[invalid_option]"), "no texts: {stderr}");
}

/// The random-weight bert reranker of kestrel-model's tests, in a folder of this test's own, and
/// llama.cpp's scores of a query's documents on it (run live).
fn reranker() -> (String, Value) {
    static RANKED: OnceLock<(String, Value)> = OnceLock::new();
    RANKED
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kestrel-cli-rerank");
            std::fs::create_dir_all(&dir).expect("make the test's folder");
            let model = dir.join(synthetic_encoder::RERANKER.file_name());
            std::fs::copy(synthetic_encoder::RERANKER.write(Path::new(&embedding_model())), &model).expect("copy the reranker");
            let documents = ["A kestrel hovers before it drops onto a vole.", "Interest rates rose again.", "kestrel", ""];
            let out = synthetic_encoder::rank_with_llama_cpp(&model, "how do falcons hunt", &documents);
            let ranked = serde_json::from_str(&std::fs::read_to_string(out).expect("read llama.cpp's scores")).expect("JSON");
            (model.to_str().expect("a UTF-8 path").to_owned(), ranked)
        })
        .clone()
}

fn stderr_of(out: &Output) -> String {
    assert!(!out.status.success(), "refused");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn rerank_gives_llama_cpp_scores_best_first() {
    let (model, ranked) = reranker();
    let cases = ranked["cases"].as_array().expect("cases");
    let query = ranked["query"].as_str().expect("query");
    let documents: Vec<&str> = cases.iter().map(|c| c["document"].as_str().expect("document")).collect();
    let mut args = vec!["-m", model.as_str(), "--query", query];
    args.extend(&documents);
    let json = answer(&kestrel("rerank", &args, ""));
    assert_eq!((json["object"].as_str(), json["model"].as_str()), (Some("list"), Some("synthetic-bert-pool4-f32")));
    assert!(ranked["cases"][0]["score"].as_f64().is_some_and(|s| s > 0.0 && s < 1.0), "llama.cpp's scores are probabilities");
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), cases.len());
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().expect("a score")).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first: {scores:?}");
    for (result, score) in results.iter().zip(&scores) {
        let case = &cases[usize::try_from(result["index"].as_u64().expect("index")).expect("an index")];
        let want = case["score"].as_f64().expect("llama.cpp's score");
        assert!((score - want).abs() < 1e-3, "{:?}: {score}, llama.cpp {want}", case["document"]);
        assert!(result.get("document").is_none());
    }
    let tokens: usize = cases.iter().map(|c| c["tokens"].as_array().expect("tokens").len()).sum();
    assert_eq!(json["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64));

    // Documents from stdin, one a line; the two best with their texts.
    let json = answer(&kestrel("rerank", &["-m", &model, "-q", query, "--top-n", "2", "--return-documents"], &documents[..3].join("\n\n")));
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for r in results {
        let index = usize::try_from(r["index"].as_u64().expect("index")).expect("an index");
        assert_eq!(r["document"]["text"].as_str(), Some(documents[index]));
    }
}

#[test]
fn rerank_refuses_other_models_and_bad_inputs_with_their_codes() {
    let (model, _) = reranker();
    let chat = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let stderr = stderr_of(&kestrel("rerank", &["-m", chat.to_str().expect("a UTF-8 path"), "-q", "q", "a"], ""));
    assert!(stderr.contains("chat model (llama)") && stderr.contains("cannot rerank") && stderr.contains("[invalid_option]"), "{stderr}");
    let stderr = stderr_of(&kestrel("rerank", &["-m", &embedding_model(), "-q", "q", "a"], ""));
    assert!(stderr.contains("embedding model") && stderr.contains("[invalid_option]"), "{stderr}");
    let stderr = stderr_of(&embed(&["-m", &model, "a"], ""));
    assert!(stderr.contains("reranker") && stderr.contains("[invalid_option]"), "{stderr}");
    for (args, stdin) in [(vec!["-q", ""], "a"), (vec!["-q", "q"], "\n"), (vec!["-q", "q", "--top-n", "0", "a"], "")] {
        let mut all = vec!["-m", model.as_str()];
        all.extend(&args);
        let stderr = stderr_of(&kestrel("rerank", &all, stdin));
        assert!(stderr.contains("[invalid_option]"), "{args:?}: {stderr}");
    }
    let long = "word ".repeat(200);
    let stderr = stderr_of(&kestrel("rerank", &["-m", &model, "-q", "q", &long], ""));
    assert!(stderr.contains("[context_overflow]"), "{stderr}");
}
