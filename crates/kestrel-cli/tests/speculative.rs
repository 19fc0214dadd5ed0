//! `kestrel generate --lookup | --draft-model`: speculative decoding as a person runs it, its
//! report in `--json`, and its bad flags refused with their codes before or as the draft loads.

use std::path::{Path, PathBuf};
use std::process::Command;

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)
}

const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Runs `kestrel generate` greedily on the CPU backend with `args`; (success, stdout, stderr).
fn generate(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["generate", "--backend", "cpu", "--temperature", "0", "-m"])
        .arg(model(DEFAULT_MODEL))
        .args(args)
        .output()
        .expect("run kestrel");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).expect("--json prints one JSON object")
}

#[test]
fn lookup_and_a_draft_model_give_the_plain_tokens_and_report_their_drafts() {
    let prompt = "one two three four five six seven eight nine ten. one two three four five six seven eight nine ten. one two";
    let run = |extra: &[&str]| {
        let mut args = vec!["--raw", "--json", "--max-tokens", "20"];
        args.extend_from_slice(extra);
        args.push(prompt);
        let (ok, stdout, stderr) = generate(&args);
        assert!(ok, "{stderr}");
        json(&stdout)
    };
    let plain = run(&[]);
    assert!(plain["speculative"].is_null(), "no speculation without its flags");
    let draft = model(DEFAULT_MODEL);
    let draft = draft.to_str().expect("a UTF-8 path");
    for flags in [vec!["--lookup"], vec!["--draft-model", draft, "--draft-max", "4", "--draft-p-min", "0"]] {
        let spec = run(&flags);
        assert_eq!(spec["token_ids"], plain["token_ids"], "{flags:?}");
        let drafted = spec["speculative"]["drafted"].as_u64().expect("speculative.drafted");
        let accepted = spec["speculative"]["accepted"].as_u64().expect("speculative.accepted");
        assert!(accepted > 0 && accepted <= drafted, "{flags:?}: {}", spec["speculative"]);
    }
}

#[test]
fn bad_speculative_flags_are_refused_with_their_codes() {
    let (ok, _, stderr) = generate(&["--lookup", "--draft-max", "0", "hi"]);
    assert!(!ok && stderr.contains("draft_max") && stderr.contains("[invalid_option]"), "{stderr}");
    // Gemma 3's vocabulary is not SmolLM2's: the first id that differs is named.
    let gemma = model("gemma-3-270m-q4_k_m.gguf");
    let (ok, _, stderr) = generate(&["--draft-model", gemma.to_str().expect("a UTF-8 path"), "hi"]);
    assert!(!ok && stderr.contains("token id") && stderr.contains("[invalid_option]"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
