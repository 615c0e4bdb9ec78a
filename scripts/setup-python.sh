#!/usr/bin/env bash
# Build the Python wheel of kvdrain and install it into the project-local virtualenv,
# idempotently:
#   1. .venv/ at the repository root (python3 -m venv), if missing;
#   2. maturin, pytest, mypy and hypothesis from PyPI, at the versions of
#      crates/kvdrain-python/constraints.txt, skipped while it is unchanged since the last
#      install;
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
constraints="$root/crates/kvdrain-python/constraints.txt"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.kvdrain-dev-requirements"
if ! cmp -s "$constraints" "$stamp"; then
    log "installing maturin, pytest, mypy, hypothesis, msgspec"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" \
        maturin \
        pytest \
        mypy \
        hypothesis \
        msgspec
    cp "$constraints" "$stamp"
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
