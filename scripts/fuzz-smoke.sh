#!/usr/bin/env bash
# Build every cargo-fuzz target and run each for N seconds (default 20) from its seeds.
set -euo pipefail
seconds="${1:-20}"
# shellcheck source=toolchains
source "$(dirname "$0")/toolchains"
cd "$(dirname "$0")/.."
# The cargo-fuzz project is fuzz/targets (its own workspace); the seeds are in fuzz/corpus.
fuzz=(--fuzz-dir fuzz/targets)
targets=$(cargo "+$NIGHTLY" fuzz list "${fuzz[@]}")
cargo "+$NIGHTLY" fuzz build "${fuzz[@]}"
log="$(mktemp)"
for t in $targets; do
    echo "[fuzz-smoke] $t for ${seconds}s"
    mkdir -p "fuzz/corpus/$t"
    if ! cargo "+$NIGHTLY" fuzz run "${fuzz[@]}" "$t" "fuzz/corpus/$t" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "[fuzz-smoke] $t FAILED"
        exit 1
    fi
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$log" || true
done
rm -f "$log"
