#!/usr/bin/env bash
# Kestrel's one entry point.
#   ./build.sh [run] ["prompt"]  build the CLI, fetch the default model, generate text with it
#   ./build.sh test              run every test (kernels on the GPU, via lavapipe where there is none)
#   ./build.sh bench             kernel benchmarks (`kestrel bench kernels`)
#   ./build.sh setup             install what building and testing needs (system packages, targets)
set -euo pipefail
cd "$(dirname "$0")"

# Vulkan loaders complain on every device creation when this is unset (containers, CI).
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR=/tmp/kestrel-xdg-$(id -u)
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi

cmd=${1:-run}
[ $# -gt 0 ] && shift

setup() {
  # A Vulkan driver: Mesa's lavapipe runs the WGSL kernels on the CPU where there is no GPU.
  if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  fi
  scripts/fetch-model.sh
}

build_cli() {
  cargo build --release -p kestrel-cli
}

case "$cmd" in
  setup)
    setup
    ;;
  run)
    setup
    build_cli
    target/release/kestrel generate "${1:-Tell me a story}"
    ;;
  test)
    setup
    cargo test --workspace --no-fail-fast
    ;;
  bench)
    setup
    build_cli
    target/release/kestrel bench kernels "$@"
    ;;
  *)
    echo "usage: ./build.sh [run [prompt] | test | bench | setup]" >&2
    exit 2
    ;;
esac
