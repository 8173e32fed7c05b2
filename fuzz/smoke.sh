#!/usr/bin/env bash
# The fuzz smoke of `make test` (`make fuzz-smoke`): builds the fuzz targets of fuzz/ with
# cargo-fuzz (libFuzzer) and runs each one for a bounded time, starting from its committed seeds
# (fuzz/seeds/TARGET: realistic inputs, and every input that once broke a target). A target that
# panics, breaks one of its properties or runs out of memory fails the smoke, and libFuzzer
# prints the input (saved under fuzz/artifacts/TARGET/).
#
# No nightly toolchain needed: the smoke builds with `--sanitizer none` (the targets are safe
# Rust; the longer runs of fuzz/README.md add AddressSanitizer on nightly) and `--dev` (a few
# seconds of fuzzing do not need optimized code, and the build is much faster).
#
# cargo-fuzz is installed once, pinned and --locked, into the cache:
#   ${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/cargo-fuzz-<version>/bin/cargo-fuzz
# (built under a temporary name and renamed when complete, so an interrupted install is never
# taken as done). The fuzz crate's dependencies are fetched with its committed Cargo.lock, as it
# is (--locked), and built into the cache too (fuzz-target/ there), so that a fresh clone
# (CI's) rebuilds only the project's own crates, not the ~250 dependencies.
#
# Usage:
#   smoke.sh                     install cargo-fuzz if missing, build, run every target
#   smoke.sh TARGET...           the same for these targets only
#   smoke.sh --print-cargo-fuzz  print the path of cargo-fuzz and exit (installs nothing)
# Environment: FUZZ_SMOKE_SECONDS (default 10) per target.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=0.13.2
cache_root="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}"
install_root="$cache_root/cargo-fuzz-$version"
cargo_fuzz="$install_root/bin/cargo-fuzz"
target_dir="$cache_root/fuzz-target"
seconds="${FUZZ_SMOKE_SECONDS:-10}"
all_targets=(request_body producer_config proxy ext_proc engine_metrics)

if [[ "${1:-}" == "--print-cargo-fuzz" ]]; then
    echo "$cargo_fuzz"
    exit 0
elif [[ "${1:-}" == -* ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
targets=("${@:-${all_targets[@]}}")

if [[ -x "$cargo_fuzz" ]]; then
    echo "fuzz-smoke: cargo-fuzz $version already installed ($cargo_fuzz)"
else
    mkdir -p "$cache_root"
    partial="$install_root.partial.$$"
    trap 'rm -rf "$partial"' EXIT
    echo "fuzz-smoke: installing cargo-fuzz $version into $install_root"
    # --debug: cargo-fuzz only runs cargo and the fuzzer, and an unoptimized build is faster.
    cargo install --quiet --debug --locked --version "=$version" --root "$partial" cargo-fuzz
    mv "$partial" "$install_root"
    trap - EXIT
fi

# cargo-fuzz runs `cargo build` itself, without --locked: check the lock first (this fails if
# Cargo.lock does not match fuzz/Cargo.toml, and downloads what is missing).
cargo fetch --locked --manifest-path "$here/Cargo.toml" --quiet

cd "$here/.."
# The targets first, with one build when all are run (they share their dependencies and link in
# parallel); `fuzz run` below then finds them built.
echo "fuzz-smoke: building ${targets[*]}"
build_log="$(mktemp)"
if [[ $# -eq 0 ]]; then
    build_names=("")
else
    build_names=("${targets[@]}")
fi
for name in "${build_names[@]}"; do
    if ! "$cargo_fuzz" fuzz build --dev --sanitizer none --target-dir "$target_dir" \
        ${name:+"$name"} >>"$build_log" 2>&1; then
        cat "$build_log" >&2
        rm -f "$build_log"
        exit 1
    fi
done
rm -f "$build_log"
for target in "${targets[@]}"; do
    corpus="$(mktemp -d)"
    echo "fuzz-smoke: $target for ${seconds}s (seeds: fuzz/seeds/$target)"
    # `cargo-fuzz fuzz run` is what `cargo fuzz run` runs (by path: no PATH change). The new corpus is thrown away: the committed seeds stay as they are.
    if ! "$cargo_fuzz" fuzz run --dev --sanitizer none --target-dir "$target_dir" \
        "$target" "$corpus" "$here/seeds/$target" \
        -- -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
        >"$corpus.log" 2>&1; then
        cat "$corpus.log" >&2
        echo "fuzz-smoke: $target FAILED (the input is under fuzz/artifacts/$target/)" >&2
        rm -rf "$corpus" "$corpus.log"
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|^Done ' \
        "$corpus.log" | sed "s/^/fuzz-smoke: $target: /" || true
    rm -rf "$corpus" "$corpus.log"
done
echo "fuzz-smoke: ${#targets[@]} passed, 0 failed"
