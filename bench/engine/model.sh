#!/usr/bin/env bash
# Writes the engine bench's tiny model (write_model.py: random weights, 4 layers x 256 wide) with
# PyPI's `gguf` package, installed once into a venv in the cache (pinned in requirements.txt):
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/engine-venv-<hash of requirements.txt>/
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/engine-model-<hash of the writer>/tiny.gguf
# Both are built under temporary names and renamed when complete.
#
# Usage:
#   model.sh               write the model when missing
#   model.sh --print-path  print the model's path and exit (writes nothing)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
venv="$cache_root/engine-venv-$(sha256sum "$here/requirements.txt" | cut -c1-12)"
model_dir="$cache_root/engine-model-$(cat "$here/requirements.txt" "$here/write_model.py" | sha256sum | cut -c1-12)"
model="$model_dir/tiny.gguf"

if [[ "${1:-}" == "--print-path" ]]; then
    echo "$model"
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

if [[ -f "$model" ]]; then
    echo "engine model: already written ($model)"
    exit 0
fi
mkdir -p "$cache_root"
if [[ ! -x "$venv/bin/python" ]]; then
    partial="$venv.partial.$$"
    trap 'rm -rf "$partial"' EXIT
    python3 -m venv "$partial"
    "$partial/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$here/requirements.txt"
    # Only the venv's python is used (its scripts' shebangs name the temporary path).
    mv "$partial" "$venv"
    trap - EXIT
fi
mkdir -p "$model_dir"
"$venv/bin/python" "$here/write_model.py" "$model"
