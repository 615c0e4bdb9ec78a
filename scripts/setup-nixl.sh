#!/usr/bin/env bash
# Install what the `kvdrain-nixl` glue needs to build and to run against real NIXL:
#   * build deps: libclang (bindgen, used by nixl-sys' build.rs) and a C++ compiler;
#   * runtime: the shared libraries of the PyPI wheel `nixl-cu12==1.5.1` (NIXL + UCX 1.23.0),
#     unpacked `--no-deps` into the git-ignored `<repo>/.nixl/`.
# Idempotent: every step is skipped when already done. Works from any cwd.
# System packages are installed only when missing, and need root (or sudo).
#   * test-only: Python's `msgpack` (what vLLM encodes PUSH_REG with), into `<repo>/.nixl/py`,
#     for the byte-for-byte registration test (crates/kvdrain-nixl/tests/registration_python.rs).
# Env: PYTHON (default python3), NIXL_WHEEL_VERSION (default 1.5.1), KVDRAIN_NIXL_DIR (default <repo>/.nixl).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
NIXL_VERSION="${NIXL_WHEEL_VERSION:-1.5.1}"
NIXL_DIR="${KVDRAIN_NIXL_DIR:-$REPO_ROOT/.nixl}"
PYTHON="${PYTHON:-python3}"
LIB_DIR="$NIXL_DIR/.nixl_cu12.mesonpy.libs"
CAPI="$LIB_DIR/libnixl_capi.so"
UCX_PLUGIN="$LIB_DIR/plugins/libplugin_UCX.so"

log() { printf '[setup-nixl] %s\n' "$*"; }
die() { printf '[setup-nixl] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root to run: $*"; fi
}

# ---- 1. build dependencies -------------------------------------------------------------
have_libclang() {
    local d f
    if [ -n "${LIBCLANG_PATH:-}" ]; then
        for f in "$LIBCLANG_PATH"/libclang.so* "$LIBCLANG_PATH"/libclang-[0-9]*.so*; do
            [ -e "$f" ] && return 0
        done
    fi
    # libclang.so / libclang-14.so.1 / libclang.so.1 (but not libclang-cpp.so*)
    if command -v ldconfig >/dev/null 2>&1 \
        && ldconfig -p 2>/dev/null | grep -qE '(^|[[:space:]/])libclang(-[0-9][0-9.]*)?\.so'; then
        return 0
    fi
    for d in /usr/lib/llvm-*/lib /usr/lib64 /usr/lib/x86_64-linux-gnu /usr/local/lib; do
        for f in "$d"/libclang.so* "$d"/libclang-[0-9]*.so*; do
            [ -e "$f" ] && return 0
        done
    done
    return 1
}

APT_PKGS=()
have_libclang || APT_PKGS+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || APT_PKGS+=(g++)
if [ "${#APT_PKGS[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${APT_PKGS[*]} and no apt-get; install them by hand"
    log "installing ${APT_PKGS[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${APT_PKGS[@]}"; then
        log "apt-get install failed; running apt-get update first"
        as_root apt-get update
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${APT_PKGS[@]}"
    fi
    have_libclang || die "libclang still not found after installing libclang-dev"
else
    log "build deps present (libclang, g++)"
fi

# ---- 2. NIXL runtime libraries from the wheel ---------------------------------------
stamp="$NIXL_DIR/.kvdrain-nixl-version"
if [ -f "$CAPI" ] && [ -f "$UCX_PLUGIN" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$NIXL_VERSION" ]; then
    log "nixl-cu12==$NIXL_VERSION already unpacked in $NIXL_DIR"
else
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"
    "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"
    log "installing nixl-cu12==$NIXL_VERSION (--no-deps) into $NIXL_DIR"
    rm -rf "$NIXL_DIR"
    mkdir -p "$NIXL_DIR"
    pip=("$PYTHON" -m pip --disable-pip-version-check --no-input)
    spec="nixl-cu12==$NIXL_VERSION"
    if "${pip[@]}" install --no-deps --no-compile --target "$NIXL_DIR" "$spec"; then
        :
    elif rm -rf "$NIXL_DIR" && mkdir -p "$NIXL_DIR" && \
        "${pip[@]}" install --no-deps --no-compile --target "$NIXL_DIR" --only-binary=:all: \
            --python-version 3.11 --platform manylinux_2_28_x86_64 "$spec"; then
        log "installed via the cp311/manylinux_2_28 fallback"
    else
        log "pip install failed; downloading the wheel and unzipping it"
        rm -rf "$NIXL_DIR" && mkdir -p "$NIXL_DIR/.download"
        "${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.11 \
            --platform manylinux_2_28_x86_64 -d "$NIXL_DIR/.download" "$spec"
        whl="$(ls "$NIXL_DIR"/.download/nixl_cu12-"$NIXL_VERSION"-*.whl | head -n1)"
        [ -n "$whl" ] || die "no wheel downloaded"
        "$PYTHON" -m zipfile -e "$whl" "$NIXL_DIR"
        rm -rf "$NIXL_DIR/.download"
    fi
    [ -f "$CAPI" ] || die "libnixl_capi.so not found at $CAPI after install"
    [ -f "$UCX_PLUGIN" ] || die "UCX plugin not found at $UCX_PLUGIN after install"
    printf '%s\n' "$NIXL_VERSION" > "$stamp"
fi

# ---- 3. Python msgpack for the registration interop test ----------------------------
PY_DIR="$NIXL_DIR/py"
if PYTHONPATH="$PY_DIR" "$PYTHON" -c 'import msgpack' >/dev/null 2>&1; then
    log "python msgpack present"
else
    log "installing python msgpack into $PY_DIR"
    "$PYTHON" -m pip --disable-pip-version-check --no-input install --no-compile --quiet \
        --target "$PY_DIR" msgpack
    PYTHONPATH="$PY_DIR" "$PYTHON" -c 'import msgpack' || die "msgpack not importable from $PY_DIR"
fi

log "libnixl_capi.so: $CAPI"
echo "$CAPI"
