#!/usr/bin/env bash
# Installs llm-d's vLLM simulator, llm-d-inference-sim, pinned, once, for the fleet bench
# (`make bench-fleet`, bench/fleet/README.md):
#   go install github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim@$VERSION
# into ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/llm-d-inference-sim-$VERSION/bin/.
# $VERSION is the Go pseudo-version of commit eec055a (v0.10.2 and 41 commits; the tag v0.10.2
# itself needs github.com/llm-d/llm-d-kv-cache, which later commits dropped).
#
# Where the Go module proxy does not serve github.com/llm-d/* (it answers 403 on some networks),
# build the binary elsewhere at that commit (or from checkouts of llm-d-inference-sim and
# llm-d-router, with a `replace` of llm-d-router to its checkout) and give its path:
#   BURST_PREFIX_LLM_D_SIM=/path/to/llm-d-inference-sim make bench-fleet
#
# Usage:
#   install-sim.sh              install it when missing (a no-op when BURST_PREFIX_LLM_D_SIM is set)
#   install-sim.sh --print-bin  print the binary's path and exit (installs nothing)
set -euo pipefail

VERSION=v0.10.3-0.20260820085535-eec055a39e6b
MODULE=github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
bin_dir="$cache_root/llm-d-inference-sim-$VERSION/bin"
bin="${BURST_PREFIX_LLM_D_SIM:-$bin_dir/llm-d-inference-sim}"

if [[ "${1:-}" == "--print-bin" ]]; then
    echo "$bin"
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

if [[ -n "${BURST_PREFIX_LLM_D_SIM:-}" ]]; then
    if [[ ! -x "$bin" ]]; then
        echo "BURST_PREFIX_LLM_D_SIM=$bin is not an executable file" >&2
        exit 1
    fi
    echo "llm-d-inference-sim: given by BURST_PREFIX_LLM_D_SIM ($bin)"
    exit 0
fi
if [[ -x "$bin" ]]; then
    echo "llm-d-inference-sim: already installed ($bin)"
    exit 0
fi
if ! command -v go >/dev/null; then
    echo "llm-d-inference-sim: needs Go (https://go.dev/dl/), or a binary in BURST_PREFIX_LLM_D_SIM" >&2
    exit 1
fi
partial="$bin_dir.partial.$$"
trap 'rm -rf "$partial"' EXIT
mkdir -p "$partial"
# Pure Go: no cgo, no libzmq, no tokenizers library.
if ! CGO_ENABLED=0 GOBIN="$partial" nice -n 10 go install "$MODULE@$VERSION"; then
    cat >&2 <<MSG
llm-d-inference-sim: \`go install $MODULE@$VERSION\` failed (above).
If the Go module proxy refused it (403 Forbidden: it does not serve github.com/llm-d/* here),
build llm-d-inference-sim at commit eec055a39e6b elsewhere and give its path:
  BURST_PREFIX_LLM_D_SIM=/path/to/llm-d-inference-sim make bench-fleet
MSG
    exit 1
fi
mkdir -p "$(dirname "$bin_dir")"
rm -rf "$bin_dir"
mv "$partial" "$bin_dir"
trap - EXIT
echo "llm-d-inference-sim $VERSION installed in $bin"
