#!/usr/bin/env bash
# Installs the Python clients the proxy tests drive (the `openai` package from PyPI, pinned in
# requirements.txt) into a venv in the cache, once:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/python-clients-<hash of requirements.txt>/
# The venv is built under a temporary name and renamed when complete, so an interrupted install
# is never taken as done.
#
# Usage:
#   setup.sh                 install whatever is missing
#   setup.sh --print-python  print the venv's python and exit (installs nothing)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="$here/requirements.txt"
key="$(sha256sum "$requirements" | cut -c1-12)"
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
venv="$cache_root/python-clients-$key"

if [[ "${1:-}" == "--print-python" ]]; then
    echo "$venv/bin/python"
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

if [[ -x "$venv/bin/python" ]]; then
    echo "python-clients: already installed ($venv)"
    exit 0
fi
mkdir -p "$cache_root"
partial="$venv.partial.$$"
trap 'rm -rf "$partial"' EXIT
python3 -m venv "$partial"
"$partial/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
# Only the venv's python is used (never its scripts, whose shebangs name the temporary path):
# it finds its packages relative to itself, so the rename keeps it working.
mv "$partial" "$venv"
trap - EXIT
"$venv/bin/python" -c 'import openai; print("python-clients: openai", openai.__version__, "installed in '"$venv"'")'
