#!/usr/bin/env bash
# Installs the routers the engine bench measures side by side with burst-prefix's proxy, from PyPI
# (pinned in requirements.txt): SGLang's router (`sglang-router`, policy cache_aware) and vLLM's
# router (`vllm-router`), both Rust binaries in wheels, into a venv in the cache, once:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/peer-routers-<hash of requirements.txt>/
# The venv is built under a temporary name and renamed when complete.
#
# The bench runs them as `<python> -m sglang_router.launch_router ...` and
# `<python> -m vllm_router.launch_router ...` (the venv's console scripts name the temporary path).
#
# Usage:
#   setup.sh                 install them when missing
#   setup.sh --print-python  print the venv's python and exit (installs nothing)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="$here/requirements.txt"
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
venv="$cache_root/peer-routers-$(sha256sum "$requirements" | cut -c1-12)"

if [[ "${1:-}" == "--print-python" ]]; then
    echo "$venv/bin/python"
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

if [[ -x "$venv/bin/python" ]]; then
    echo "peer routers: already installed ($venv)"
    exit 0
fi
mkdir -p "$cache_root"
partial="$venv.partial.$$"
trap 'rm -rf "$partial"' EXIT
python3 -m venv "$partial"
"$partial/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
mv "$partial" "$venv"
trap - EXIT
"$venv/bin/python" -c '
import importlib.metadata as m
print("peer routers:", ", ".join(f"{p} {m.version(p)}" for p in ("sglang-router", "vllm-router")), "installed in '"$venv"'")'
