#!/usr/bin/env bash
# Installs inference-perf (pinned in requirements.txt, from PyPI) for the fleet bench, once, into a
# venv in the cache, and writes the offline tokenizer it needs (write_tokenizer.py: it would
# otherwise download one from a model hub):
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/inference-perf-<hash of requirements.txt and write_tokenizer.py>/
#     bin/python, tokenizer/
# inference-perf 0.7.0 needs Python >= 3.12: BURST_PREFIX_PYTHON312 names one, else python3.12 on
# the PATH, else pyenv's newest 3.12. The venv is built under a temporary name and renamed when
# complete (~790 MB). The bench runs `<python> -m inference_perf.main --config_file FILE` with
# HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1.
#
# Usage:
#   setup.sh                    install when missing
#   setup.sh --print-python     print the venv's python and exit (installs nothing)
#   setup.sh --print-tokenizer  print the tokenizer's directory and exit (installs nothing)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
key="$(cat "$here/requirements.txt" "$here/write_tokenizer.py" | sha256sum | cut -c1-12)"
venv="$cache_root/inference-perf-$key"

case "${1:-}" in
    --print-python) echo "$venv/bin/python"; exit 0 ;;
    --print-tokenizer) echo "$venv/tokenizer"; exit 0 ;;
    "") ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac

if [[ -x "$venv/bin/python" && -f "$venv/tokenizer/tokenizer.json" ]]; then
    echo "inference-perf: already installed ($venv)"
    exit 0
fi

# The first candidate that runs and is >= 3.12 (a pyenv shim may exist and not run).
python312=""
for candidate in "${BURST_PREFIX_PYTHON312:-}" "$(command -v python3.12 || true)" \
    $(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python3 2>/dev/null | sort -rV); do
    if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' 2>/dev/null; then
        python312="$candidate"
        break
    fi
done
if [[ -z "$python312" ]]; then
    echo "inference-perf needs Python >= 3.12: set BURST_PREFIX_PYTHON312 to one" >&2
    exit 1
fi

mkdir -p "$cache_root"
partial="$venv.partial.$$"
trap 'rm -rf "$partial"' EXIT
"$python312" -m venv "$partial"
"$partial/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$here/requirements.txt"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$partial/bin/python" "$here/write_tokenizer.py" "$partial/tokenizer"
mv "$partial" "$venv"
trap - EXIT
"$venv/bin/python" -c '
import importlib.metadata as m
print("inference-perf", m.version("inference-perf"), "installed in '"$venv"'")'
