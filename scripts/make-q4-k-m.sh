#!/usr/bin/env bash
# Makes models/SmolLM2-135M-Instruct.Q4_K_M.gguf from the default model with llama.cpp's own
# quantizer (prebuilt, through tools/llama-cpp: see its README), and checks it is byte for byte
# the file tests/data/reference-q4_k_m was made from. The K-quant model tests need it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL=models/SmolLM2-135M-Instruct.Q4_K_M.gguf
SHA256=dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --status; then
  exit 0
fi
scripts/fetch-model.sh
if [ ! -d tools/llama-cpp/node_modules/@node-llama-cpp/linux-x64 ]; then
  # Not `npm ci`: the lock file cannot list node-llama-cpp's optional binaries for other
  # platforms (some versions are not on every registry); `install --no-save` keeps the lock's pins.
  (cd tools/llama-cpp && npm install --no-save --no-audit --no-fund)
fi
python3 tools/llama-cpp/quantize.py "$SOURCE" "$MODEL.tmp" q4_k_m --threads 2 >/dev/null
if ! echo "$SHA256  $MODEL.tmp" | sha256sum -c --quiet; then
  echo "llama.cpp's Q4_K_M of $SOURCE is not the reference file (sha256 $SHA256)" >&2
  exit 1
fi
mv "$MODEL.tmp" "$MODEL"
echo "made $MODEL with llama.cpp's quantizer"
