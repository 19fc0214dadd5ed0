#!/usr/bin/env bash
# The real-GPU check: Kestrel's kernels and decode/prefill speed on whatever Vulkan device the
# machine has, in one go and inside 5 minutes, with no model file (the models are made in memory
# with random weights in the real layouts: kestrel_model::synthetic) and no network.
#
#   bench/gpu-check.sh prepare   here: builds the release CLI and copies it with the Vulkan loader
#                                (libvulkan.so.1) into target/gpu-check/ (about 16 MB: carry it)
#   bench/gpu-check.sh           there: the full check (135M, 1B and 8B shapes)
#   bench/gpu-check.sh --smoke   the smallest size (135M, a few tokens): `./build.sh test` runs it
#                                on lavapipe so that the script never rots
#
# Prints the adapter and the kernel variants chosen for it, each kernel's time and fraction of the
# measured copy bandwidth (`kestrel bench kernels`: the 135M and 1B models' shapes), then for each
# synthetic model its load time, prefill and decode tok/s, the decode roofline and the per-family
# decode step profile (`kestrel bench model --synthetic`), and batched decode's tokens per second
# at 1 to 16 sequences with the ratio to one and the inter-token latency while a 512-token prompt
# is admitted (`kestrel bench batch --synthetic`, 135M and 1B). KESTREL_BIN overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check

if [ "${1:-}" = "prepare" ]; then
  cargo build --release -p kestrel-cli
  mkdir -p "$dir/lib"
  cp target/release/kestrel "$dir/"
  loader=$(ldconfig -p | awk '$1 == "libvulkan.so.1" { print $NF; exit }')
  [ -n "$loader" ] || { echo "no libvulkan.so.1 here: apt-get install libvulkan1" >&2; exit 1; }
  cp -L "$loader" "$dir/lib/libvulkan.so.1"
  du -sh "$dir"
  exit 0
fi

smoke=0
case "${1:-}" in
  "") ;;
  --smoke) smoke=1 ;;
  *) echo "usage: bench/gpu-check.sh [prepare | --smoke]" >&2; exit 2 ;;
esac

bin=${KESTREL_BIN:-}
if [ -z "$bin" ]; then
  if [ -x "$dir/kestrel" ]; then bin=$dir/kestrel; else bin=target/release/kestrel; fi
fi
[ -x "$bin" ] || { echo "no kestrel binary at $bin: run bench/gpu-check.sh prepare" >&2; exit 1; }
# The carried loader, where the machine has none of its own.
if [ -d "$dir/lib" ]; then export LD_LIBRARY_PATH="$PWD/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR=/tmp/kestrel-xdg-$(id -u)
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi

started=$(date +%s)
echo "# Kestrel GPU check ($(date -u +%FT%TZ), $("$bin" --version 2>/dev/null || echo kestrel))"
echo
echo "Vulkan ICDs: $(ls /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ 2>/dev/null | tr '\n' ' ')"
echo
if [ $smoke = 1 ]; then
  "$bin" bench kernels --quick --filter "135m matvec q4_1"
  "$bin" bench model --backend gpu --synthetic 135m --prompt-tokens 8 --decode-tokens 4 --repeats 1 --context 64 --copy-mib 8
  "$bin" bench batch --backend gpu --synthetic 135m --batch-sizes 2 --prompt-tokens 1 --decode-tokens 2 --repeats 1 --long-prompt 0 --context 64
else
  "$bin" bench kernels
  for shape in 135m 1b 8b; do
    echo
    echo "## synthetic $shape"
    echo
    "$bin" bench model --backend gpu --synthetic "$shape" --prompt-tokens 128,512 --decode-tokens 64 --repeats 2 --context 1024
    # Batched decode for the two small shapes: making the 8B's weights again would double the
    # check's longest part.
    if [ "$shape" != 8b ]; then
      echo
      echo "## synthetic $shape, batched decode"
      echo
      "$bin" bench batch --backend gpu --synthetic "$shape" --batch-sizes 1,2,4,8,16 --prompt-tokens 32 --decode-tokens 64 --repeats 2 --context 1024
    fi
  done
fi
echo
echo "gpu-check: $(($(date +%s) - started)) s"
