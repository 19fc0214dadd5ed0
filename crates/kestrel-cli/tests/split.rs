//! Split models as a person makes and runs them: `kestrel split` writes gguf-split's shards,
//! llama.cpp itself loads them (node-llama-cpp's build, tools/llama-cpp), and `kestrel` runs the
//! model from its first shard's name with the whole file's output.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kestrel(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel")).args(args).output().expect("run kestrel");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The default model split into shards of at most 40 MB in `dir` (a fresh folder): three, and
/// with `metadata_shard` a first one of metadata only before them.
fn split_default_model(dir: &str, metadata_shard: bool) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make the shards' folder");
    let model = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let prefix = dir.join("smol");
    let mut args = vec!["split", model.to_str().expect("a UTF-8 path"), prefix.to_str().expect("a UTF-8 path"), "--max-size", "40M"];
    if metadata_shard {
        args.push("--no-tensor-first-split");
    }
    let (ok, stdout, stderr) = kestrel(&args);
    assert!(ok, "{stderr}");
    let count = if metadata_shard { 4 } else { 3 };
    let shards: Vec<PathBuf> = (1..=count).map(|k| dir.join(format!("smol-0000{k}-of-0000{count}.gguf"))).collect();
    for shard in &shards {
        assert!(stdout.contains(&shard.display().to_string()), "{stdout}");
        let bytes = std::fs::metadata(shard).expect("a shard").len();
        // 40 MB of tensor data, plus the first shard's header (the vocabulary).
        assert!(bytes <= 42_000_000, "{}: {bytes} bytes", shard.display());
    }
    if metadata_shard {
        // The vocabulary and no tensor.
        let bytes = std::fs::metadata(&shards[0]).expect("the metadata shard").len();
        assert!(bytes < 2_000_000, "{bytes} bytes");
    }
    shards
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

#[test]
fn split_models_run_from_the_first_shard_as_the_whole_file() {
    let model = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let run = |m: &Path| {
        let (ok, stdout, stderr) = kestrel(&[
            "generate",
            "--backend",
            "cpu",
            "-m",
            path(m),
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "The capital of France is",
        ]);
        assert!(ok, "{stderr}");
        stdout
    };
    let whole = run(&model);
    assert!(whole.split_whitespace().count() >= 4, "{whole}");
    // The shards' metadata and tensor table, merged, are the file's.
    let inspect = |m: &Path| {
        let (ok, stdout, stderr) = kestrel(&["inspect", "--tensors", "-m", path(m)]);
        assert!(ok, "{stderr}");
        stdout.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
    };
    for metadata_shard in [false, true] {
        let shards = split_default_model(&format!("split-run-{metadata_shard}"), metadata_shard);
        assert_eq!(run(&shards[0]), whole, "metadata shard: {metadata_shard}");
        assert_eq!(inspect(&shards[0]), inspect(&model), "metadata shard: {metadata_shard}");
    }
}

#[test]
fn a_shard_that_is_not_the_first_or_a_missing_shard_is_a_bad_model() {
    let shards = split_default_model("split-errors", false);
    let (ok, _, stderr) = kestrel(&["generate", "-m", path(&shards[1]), "Hello"]);
    assert!(!ok && stderr.contains("[bad_model]") && stderr.contains("shard 2 of 3") && stderr.contains("first shard"), "{stderr}");
    std::fs::remove_file(&shards[2]).expect("remove the last shard");
    let (ok, _, stderr) = kestrel(&["generate", "--backend", "cpu", "-m", path(&shards[0]), "Hello"]);
    assert!(!ok && stderr.contains(&shards[2].display().to_string()), "{stderr}");
}

/// The shards are gguf-split's: llama.cpp loads the model from the first one (here a shard of
/// metadata only, the less common layout) and gives the greedy tokens and logits it gives for the
/// whole file, run here too: llama.cpp's CPU kernels differ from one x86-64 level to another (the
/// recorded tests/data/reference/greedy.json came from another machine, and two of its prompts'
/// first tokens are near ties that an Intel Xeon's kernels break the other way).
#[test]
fn llama_cpp_loads_the_shards() {
    let shards = split_default_model("split-llama-cpp", true);
    let root = repo();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("split-llama-cpp");
    let whole = dir.join("whole.json");
    let reference = |model: &Path, out: &Path, compare: Option<&Path>| {
        let mut command = Command::new("node");
        command.current_dir(root.join("tools/llama-cpp")).arg("reference.mjs").arg(model);
        command.arg(root.join("tests/data/reference/prompts.json")).arg(out).args(["--steps", "8"]);
        if let Some(compare) = compare {
            command.arg("--compare").arg(compare);
        }
        let run = command.output().expect("run node tools/llama-cpp/reference.mjs (./build.sh test installs its packages)");
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
        stdout
    };
    reference(&root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"), &whole, None);
    let stdout = reference(&shards[0], &dir.join("shards.json"), Some(&whole));
    assert!(stdout.contains("ALL PROMPTS REPRODUCED"), "{stdout}");
}
