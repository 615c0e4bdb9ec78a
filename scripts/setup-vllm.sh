#!/usr/bin/env bash
# The vLLM test environment, idempotently:
#   1. .venv-vllm/ at the repository root (python3 -m venv), if missing;
#   2. crates/kvdrain-python/requirements-vllm.txt (vllm==0.33.0, nixl, pytest) from PyPI,
#      skipped while the file is unchanged since the last install (stamp file);
#   3. the kvdrain wheel that `make python` builds (target/wheels-python/), installed
#      over any earlier copy.
# Works from any cwd. PYTHON picks the interpreter that creates the venv (default python3).
set -euo pipefail

log() { printf '[setup-vllm] %s\n' "$*"; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-vllm"
reqs="$root/crates/kvdrain-python/requirements-vllm.txt"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.kvdrain-vllm-requirements"
if ! cmp -s "$reqs" "$stamp"; then
    log "installing $(grep -v '^#' "$reqs" | tr '\n' ' ')(several GB, minutes)"
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
    cp "$reqs" "$stamp"
    log "installed in $(( $(date +%s) - start )) s"
fi

wheel="$(ls "$root"/target/wheels-python/kvdrain-*.whl)"
log "installing $(basename "$wheel")"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --force-reinstall "$wheel"
