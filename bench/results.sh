#!/usr/bin/env bash
# Runs every figure of bench/RESULTS.md and prints the JSON lines (stdout) with a header
# per step (stderr). Usage: bench/results.sh [--quick] [--no-python]
#   KVDRAIN=path/to/kvdrain  (default: $CARGO_TARGET_DIR or target, release build)
# --quick: fewer repetitions and messages (a smoke run, not for publishing).
set -euo pipefail
cd "$(dirname "$0")/.."

reps=21 sweep_reps=11 m=2_000_000 sweep_m=1_000_000 py_reps=3 python=1
for arg in "$@"; do
    case "$arg" in
        --quick) reps=3 sweep_reps=3 m=200_000 sweep_m=100_000 py_reps=1 ;;
        --no-python) python=0 ;;
        *) echo "usage: $0 [--quick] [--no-python]" >&2; exit 2 ;;
    esac
done
K=${KVDRAIN:-${CARGO_TARGET_DIR:-target}/release/kvdrain}
[ -x "$K" ] || cargo build --release -p kvdrain-cli >&2

step() { echo "== $*" >&2; }

step machine
echo "{\"machine\":\"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\",\"cpus\":$(nproc),\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"rustc\":\"$(rustc --version)\"}"
step memory
"$K" bench memory
step "compare R=4096 E=2"
if [ "$python" = 1 ]; then
    "$K" bench compare --inflight 4096 --edges 2 --notifications "$m" --reps "$reps" --python-reps "$py_reps"
else
    "$K" bench compare --inflight 4096 --edges 2 --notifications "$m" --reps "$reps" --no-python
fi
step "ingest named R=4096 E=2"
"$K" bench ingest --inflight 4096 --edges 2 --notifications "$m" --reps "$reps" --mode named
step "sweep counting"
"$K" bench sweep --notifications "$sweep_m" --reps "$sweep_reps"
step "latency (two threads, one thread, hand-off)"
"$K" bench latency --requests "$((reps * 5000))"
"$K" bench latency --requests "$((reps * 5000))" --batch 16
step "tick"
"$K" bench tick --inflight 65536 --expiring 4 --ticks 4096 --reps "$reps"
"$K" bench tick --inflight 4096 --expiring 1 --ticks 4096 --reps "$reps"
if command -v valgrind >/dev/null; then
    step "callgrind profile"
    python3 bench/profile.py --binary "$K" --edges 2 | tail -1
    python3 bench/profile.py --binary "$K" --edges 32 --notifications 256000 | tail -1
fi
