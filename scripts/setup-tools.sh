#!/usr/bin/env bash
# Install the Rust tooling the full test suite uses, idempotently:
#   rustfmt, clippy, the thumbv7em-none-eabihf target (no_std proof), a nightly toolchain
#   with miri and rust-src (miri, cargo-fuzz), and cargo-fuzz itself; for the C ABI
#   (make c-test): cbindgen (pinned), pkg-config, and gcc/g++ with their sanitizer runtimes.
# Each step is skipped when already done. Works from any cwd.
set -euo pipefail

log() { printf '[setup-tools] %s\n' "$*"; }

installed_components="$(rustup component list --installed 2>/dev/null || true)"
for c in rustfmt clippy; do
    if ! grep -q "^$c" <<<"$installed_components"; then
        log "rustup component add $c"
        rustup component add "$c"
    fi
done

if ! rustup target list --installed | grep -qx thumbv7em-none-eabihf; then
    log "rustup target add thumbv7em-none-eabihf"
    rustup target add thumbv7em-none-eabihf
fi

if ! rustup toolchain list | grep -q '^nightly'; then
    log "installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
nightly_components="$(rustup +nightly component list --installed 2>/dev/null || true)"
for c in miri rust-src; do
    if ! grep -q "^$c" <<<"$nightly_components"; then
        log "rustup +nightly component add $c"
        rustup +nightly component add "$c"
    fi
done

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo install cargo-fuzz"
    cargo install --locked cargo-fuzz
fi
CBINDGEN_VERSION=0.29.2
if [ "$(cbindgen --version 2>/dev/null)" != "cbindgen $CBINDGEN_VERSION" ]; then
    log "cargo install cbindgen $CBINDGEN_VERSION"
    cargo install --locked --force cbindgen --version "$CBINDGEN_VERSION"
fi

missing_apt=()
command -v pkg-config >/dev/null 2>&1 || missing_apt+=(pkg-config)
command -v cc >/dev/null 2>&1 || missing_apt+=(gcc)
command -v g++ >/dev/null 2>&1 || missing_apt+=(g++)
if [ "${#missing_apt[@]}" -gt 0 ]; then
    log "apt-get install ${missing_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing_apt[@]}"
fi

log "tools ready"
