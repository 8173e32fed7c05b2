#!/usr/bin/env bash
# The last line of `make test`: which tests on real vLLM ran, which did not and why, from the
# lines they appended to LOG (crates/test-support/src/real_engine.rs writes them).
# Usage: summary.sh LOG
set -euo pipefail
log="${1:?usage: summary.sh LOG}"
if [[ ! -s "$log" ]]; then
    echo "real-engine tests: none recorded in $log (none of the tests on real vLLM ran)"
    exit 0
fi
ran=0 not_run=0 why="" names="" kernels=""
while IFS=$'\t' read -r what test detail; do
    case "$what" in
        ran) ran=$((ran + 1)) kernels="$detail" ;;
        "not run") not_run=$((not_run + 1)) why="$detail" names="${names:+$names, }$test" ;;
    esac
done <"$log"
line="real-engine tests: $ran ran"
((ran == 0)) || line+=" ($kernels)"
if ((not_run == 0)); then
    line+=", none skipped"
else
    line+=", $not_run did not run ($why): $names"
fi
echo "$line"
