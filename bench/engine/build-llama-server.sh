#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` once, from the llama-cpp-python sdist on PyPI (which vendors
# llama.cpp; version and sha256 pinned below), into a cache directory named after the version:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/llama-server-<version>/bin/llama-server
# A cold build takes ~9 min on 2 cores (run it under `nice`); a warm run only checks the binary.
# The binary is built in a temporary directory and renamed when complete, so an interrupted build
# is never taken as done.
#
# Usage:
#   build-llama-server.sh              build it when missing
#   build-llama-server.sh --print-bin  print the binary's path and exit (builds nothing)
set -euo pipefail

llama_cpp_python_version="0.3.36"
sdist_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
install_dir="$cache_root/llama-server-$llama_cpp_python_version"
bin="$install_dir/bin/llama-server"

if [[ "${1:-}" == "--print-bin" ]]; then
    echo "$bin"
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

if [[ -x "$bin" ]]; then
    echo "llama-server: already built ($bin)"
    exit 0
fi
for tool in cmake c++ pip3 sha256sum tar; do
    command -v "$tool" >/dev/null || { echo "build-llama-server.sh: needs $tool" >&2; exit 1; }
done

mkdir -p "$cache_root"
work="$(mktemp -d "$cache_root/llama-server-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "llama-server: downloading the llama-cpp-python $llama_cpp_python_version sdist from PyPI"
pip3 download --quiet --disable-pip-version-check --no-input --no-deps --no-binary :all: \
    "llama-cpp-python==$llama_cpp_python_version" -d "$work/sdist"
sdist="$work/sdist/llama_cpp_python-$llama_cpp_python_version.tar.gz"
echo "$sdist_sha256  $sdist" | sha256sum --check --quiet
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$llama_cpp_python_version/vendor/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || { echo "build-llama-server.sh: no llama.cpp in the sdist" >&2; exit 1; }

# No network at build time (LLAMA_USE_PREBUILT_UI=ON would download the web UI), no TLS, no curl,
# one static binary.
echo "llama-server: building (cmake Release, target llama-server)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log" 2>&1 \
    || { tail -40 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }

built="$work/build/bin/llama-server"
"$built" --version >/dev/null 2>&1 || { echo "build-llama-server.sh: the built binary does not run" >&2; exit 1; }
mkdir -p "$work/install/bin"
mv "$built" "$work/install/bin/llama-server"
rm -rf "$install_dir"
mv "$work/install" "$install_dir"
# The whole --version output first, then its version line (a pipe into `grep -m1` could kill
# the binary with SIGPIPE under pipefail).
version_output="$("$bin" --version 2>&1 || true)"
echo "llama-server: built $bin ($(grep -m1 -i version <<<"$version_output" || true))"
