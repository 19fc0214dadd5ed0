//! The CLI as a person runs it: a bad model or request ends the command with a message that
//! carries the error's stable code, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use kestrel_gguf::{GgufWriter, MetadataValue, TensorSpec};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The default model with its chat template replaced by `template`, written to the test folder.
fn with_template(template: &str, name: &str) -> PathBuf {
    let (header, tensors) = kestrel_gguf::read_file(&default_model()).expect("read the default model (./build.sh setup)");
    let mut metadata = header.metadata.clone();
    metadata.set("tokenizer.chat_template", MetadataValue::String(template.into()));
    let specs: Vec<TensorSpec> =
        header.tensors.iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type }).collect();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create the model file"));
    let mut writer = GgufWriter::new(file, &metadata, &specs).expect("write the header");
    for data in &tensors {
        writer.write_tensor(data).expect("write a tensor");
    }
    writer.finish().expect("finish the file");
    path
}

/// Runs `kestrel generate` with `args`; returns whether it succeeded and its stderr.
fn generate(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel")).arg("generate").args(args).output().expect("run kestrel");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn runaway_chat_template_is_a_template_error_and_raw_prompts_still_run() {
    let model =
        with_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "cli-runaway-template.gguf");
    let model = model.to_str().expect("a UTF-8 path");
    let (ok, stderr) = generate(&["-m", model, "--max-tokens", "2", "Hello"]);
    assert!(!ok, "a runaway template must fail the command");
    assert!(stderr.contains("[template]") && stderr.contains("fuel"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The same file with a raw prompt needs no template.
    let (ok, stderr) = generate(&["-m", model, "--raw", "--max-tokens", "2", "--temperature", "0", "Hello"]);
    assert!(ok, "{stderr}");
}

#[test]
fn broken_files_and_bad_options_carry_their_codes() {
    let garbage = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-garbage.gguf");
    std::fs::write(&garbage, b"not a gguf file at all").expect("write the garbage file");
    let (ok, stderr) = generate(&["-m", garbage.to_str().expect("a UTF-8 path"), "Hello"]);
    assert!(!ok && stderr.contains("[bad_model]"), "{stderr}");
    let model = default_model();
    let (ok, stderr) = generate(&["-m", model.to_str().expect("a UTF-8 path"), "--top-p", "1.5", "Hello"]);
    assert!(!ok && stderr.contains("[invalid_option]") && stderr.contains("top_p"), "{stderr}");
}

/// Output read by a program that stops early (`kestrel inspect --tensors | head -1`) ends the
/// command quietly, as SIGPIPE ends other Unix tools, rather than in a panic.
#[cfg(unix)]
#[test]
fn a_reader_that_stops_early_is_no_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    /// SIGPIPE's number on Linux and the BSDs.
    const SIGPIPE: i32 = 13;
    let model = default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args(["inspect", "--tensors", "-m", model.to_str().expect("a UTF-8 path")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kestrel");
    // The reader is gone before the command writes its first line (it reads the file first).
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for kestrel");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(SIGPIPE), "{:?}: {stderr}", out.status);
}

/// The engine's settings have one front door: `kestrel serve`'s and `kestrel generate`'s flags
/// are checked by `EngineOptions::settings`, as the browser package's `createEngine` options are,
/// with the same bounds and the same messages, before any model loads.
#[test]
fn engine_flags_are_checked_as_the_browsers_options_are() {
    let model = default_model();
    let model = model.to_str().expect("a UTF-8 path");
    let message = |json: &str| {
        let options = kestrel_engine::EngineOptions::parse(json).expect("parses");
        options.settings().expect_err("out of range").message
    };
    for (flags, json) in [
        (["--prefill-chunk", "0"], r#"{"prefill_chunk": 0}"#),
        (["--prefill-chunk", "5000"], r#"{"prefill_chunk": 5000}"#),
        (["--slots", "17"], r#"{"slots": 17}"#),
        (["--kv-cache", "q8"], r#"{"kv_cache": "q8"}"#),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
            .args(["serve", "-m", model, "--port", "0"])
            .args(flags)
            .output()
            .expect("run kestrel serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} must be refused");
        let want = message(json);
        assert!(stderr.contains(&want) && stderr.contains("[invalid_option]"), "{flags:?}: {stderr} (the browser's: {want})");
        assert!(!stderr.contains("loaded"), "{flags:?}: checked before the model loads: {stderr}");
    }
    let (ok, stderr) = generate(&["-m", model, "--kv-cache", "q8", "Hello"]);
    assert!(!ok && stderr.contains(&message(r#"{"kv_cache": "q8"}"#)), "{stderr}");
}
