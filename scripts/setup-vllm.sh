#!/usr/bin/env bash
# The vLLM test environment, idempotently:
#   1. .venv-vllm/ at the repository root (python3 -m venv), if missing;
#   2. vllm, nixl, pytest, mypy and py-spy from PyPI, at the versions of
#      crates/kvdrain-python/constraints.txt, skipped while it is unchanged since the last
#      install (stamp file);
#   3. the kvdrain wheel that `make python` builds (target/wheels-python/), installed
#      over any earlier copy.
# Works from any cwd. PYTHON picks the interpreter that creates the venv (default python3).
set -euo pipefail

log() { printf '[setup-vllm] %s\n' "$*"; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-vllm"
constraints="$root/crates/kvdrain-python/constraints.txt"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.kvdrain-vllm-requirements"
if ! cmp -s "$constraints" "$stamp"; then
    log "installing vllm, nixl, pytest, mypy, py-spy (several GB, minutes)"
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" \
        vllm \
        nixl \
        pytest \
        mypy \
        py-spy
    cp "$constraints" "$stamp"
    log "installed in $(( $(date +%s) - start )) s"
fi

wheel="$(ls "$root"/target/wheels-python/kvdrain-*.whl)"
log "installing $(basename "$wheel")"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --force-reinstall "$wheel"
