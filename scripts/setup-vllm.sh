#!/usr/bin/env bash
# A vLLM test environment, idempotently, for one vLLM release:
#   usage: setup-vllm.sh [X.Y.Z]   (default: the vllm pin of crates/kvdrain-python/constraints.txt)
#   1. uv (pinned in constraints.txt) in its own small venv, .venv-uv/, if missing;
#   2. the environment: .venv-vllm/ for the default release, .venv-vllm-X.Y.Z/ for another
#      (VLLM_VENV overrides), created afresh by `uv venv --clear --seed` whenever step 3's
#      requirements changed (stamp file), kept otherwise;
#   3. vllm==X.Y.Z, nixl, pytest, mypy and py-spy from PyPI, at the versions of constraints.txt with
#      its vllm pin replaced by X.Y.Z, less the packages of
#      crates/kvdrain-python/excludes-vllm.txt (uv's --excludes; it says why). A release
#      whose own pins PyPI cannot satisfy has an overrides file,
#      crates/kvdrain-python/overrides-vllm-X.Y.Z.txt (uv's --overrides; it says why);
#   4. the kvdrain wheel that `make python` builds (target/wheels-python/), installed over
#      any earlier copy (KVDRAIN_WHEEL=none skips it: an environment for the gate only).
# Every environment shares one uv cache (UV_CACHE_DIR, default ~/.cache/uv) and is filled
# from it by hard links (UV_LINK_MODE=hardlink): a second release costs what differs from
# the first (vLLM itself), not a second copy of torch and its CUDA libraries. On a
# filesystem other than the cache's, uv copies instead (slower, as large as pip's).
# Works from any cwd. PYTHON picks the interpreter of the environments (default python3).
set -euo pipefail

log() { printf '[setup-vllm] %s\n' "$*"; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
constraints="$root/crates/kvdrain-python/constraints.txt"
default_vllm="$(sed -n 's/^vllm==//p' "$constraints")"
release="${1:-$default_vllm}"
case "$release" in
    [0-9]*.[0-9]*.[0-9]*) ;;
    *) log "not a vLLM version: '$release' (X.Y.Z)"; exit 2 ;;
esac
if [[ "$release" == "$default_vllm" ]]; then
    venv="${VLLM_VENV:-$root/.venv-vllm}"
    # Every release answers to .venv-vllm-X.Y.Z (the Makefile's name for it).
    ln -sfn .venv-vllm "$root/.venv-vllm-$release"
else
    venv="${VLLM_VENV:-$root/.venv-vllm-$release}"
fi
export UV_CACHE_DIR="${UV_CACHE_DIR:-$HOME/.cache/uv}"
export UV_LINK_MODE="${UV_LINK_MODE:-hardlink}"
python="$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')"

# 1. uv itself, at its pin.
uv_pin="$(grep '^uv==' "$constraints")"
uvenv="$root/.venv-uv"
installed_uv="$(cat "$uvenv/.kvdrain-uv" 2>/dev/null || true)"
if [[ ! -x "$uvenv/bin/uv" ]] || [[ "$uv_pin" != "$installed_uv" ]]; then
    log "installing $uv_pin into $uvenv"
    "${PYTHON:-python3}" -m venv "$uvenv"
    "$uvenv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" uv
    echo "$uv_pin" > "$uvenv/.kvdrain-uv"
fi
uv="$uvenv/bin/uv"

# 2. and 3. the environment, created afresh whenever what it should hold changed (a new
# set of packages is not installed over an old one, so the environment is always exactly
# its requirements): this release's constraints, its overrides, the excludes.
excludes="$root/crates/kvdrain-python/excludes-vllm.txt"
overrides=()
override_file="$root/crates/kvdrain-python/overrides-vllm-$release.txt"
if [[ -f "$override_file" ]]; then
    overrides=(--overrides "$override_file")
fi
wanted="$(sed "s/^vllm==.*/vllm==$release/" "$constraints"; cat "$excludes" "${overrides[@]:1}")"
stamp="$venv/.kvdrain-vllm-requirements"
current="$(cat "$stamp" 2>/dev/null || true)"
if [[ ! -x "$venv/bin/python" ]] || [[ "$wanted" != "$current" ]]; then
    log "creating $venv: vllm==$release, nixl, pytest, mypy, py-spy (uv, cache $UV_CACHE_DIR)"
    start=$(date +%s)
    "$uv" venv --quiet --clear --seed --python "$python" "$venv"
    pins="$venv/.kvdrain-constraints.txt"
    sed "s/^vllm==.*/vllm==$release/" "$constraints" > "$pins"
    "$uv" pip install --quiet --python "$venv/bin/python" -c "$pins" --excludes "$excludes" \
        "${overrides[@]}" \
        vllm \
        nixl \
        pytest \
        mypy \
        py-spy
    printf '%s\n' "$wanted" > "$stamp"
    log "created in $(( $(date +%s) - start )) s"
fi

# 4. the kvdrain wheel.
if [[ "${KVDRAIN_WHEEL:-}" == none ]]; then
    log "KVDRAIN_WHEEL=none: no kvdrain wheel installed"
    exit 0
fi
wheel="$(ls "$root"/target/wheels-python/kvdrain-*.whl)"
log "installing $(basename "$wheel")"
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps --reinstall "$wheel"
