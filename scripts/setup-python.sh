#!/usr/bin/env bash
# Build the Python wheel of kvdrain and install it into the project-local virtualenv,
# idempotently:
#   1. .venv/ at the repository root (python3 -m venv), if missing;
#   2. crates/kvdrain-python/requirements-dev.txt from PyPI (maturin, pytest, mypy, hypothesis),
#      skipped while the file is unchanged since the last install;
#   3. the abi3 wheel (maturin build --release) into target/wheels-python/, installed
#      into .venv over any earlier build;
#   4. the `kvdrain` binary (release), which the replay-agreement test calls.
# Works from any cwd. PYTHON picks the interpreter that creates the venv (default python3).
set -euo pipefail

log() { printf '[setup-python] %s\n' "$*"; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
wheels="$root/target/wheels-python"
reqs="$root/crates/kvdrain-python/requirements-dev.txt"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.kvdrain-dev-requirements"
if ! cmp -s "$reqs" "$stamp"; then
    log "installing $(grep -v '^#' "$reqs" | tr '\n' ' ')"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
    cp "$reqs" "$stamp"
fi

log "building the wheel"
rm -rf "$wheels"
"$venv/bin/maturin" build --quiet --release --manifest-path crates/kvdrain-python/Cargo.toml \
    --interpreter "$venv/bin/python" --out "$wheels"
wheel="$(ls "$wheels"/kvdrain-*.whl)"
log "installing $(basename "$wheel")"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --force-reinstall "$wheel"

log "building the kvdrain binary (replay)"
cargo build --quiet --release --bin kvdrain
