#!/usr/bin/env bash
# Install the Rust tooling the full test suite uses, idempotently:
#   rustfmt, clippy, the thumbv7em-none-eabihf target (no_std proof), the pinned nightly
#   with miri and rust-src (miri, cargo-fuzz), the core's minimum Rust (`make msrv`),
#   cargo-fuzz itself and cargo-deny (pinned); for the C ABI (make c-test): cbindgen
#   (pinned), pkg-config, and gcc/g++ with their sanitizer runtimes. The pinned
#   toolchains are in scripts/toolchains.
# Each step is skipped when already done. Works from any cwd.
set -euo pipefail

log() { printf '[setup-tools] %s\n' "$*"; }
# shellcheck source=toolchains
source "$(dirname "$0")/toolchains"

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

if ! rustup toolchain list | grep -q "^$NIGHTLY"; then
    log "installing $NIGHTLY"
    rustup toolchain install "$NIGHTLY" --profile minimal
fi
nightly_components="$(rustup "+$NIGHTLY" component list --installed 2>/dev/null || true)"
for c in miri rust-src; do
    if ! grep -q "^$c" <<<"$nightly_components"; then
        log "rustup +$NIGHTLY component add $c"
        rustup "+$NIGHTLY" component add "$c"
    fi
done

if ! rustup toolchain list | grep -q "^$MSRV-"; then
    log "installing Rust $MSRV (the core's rust-version)"
    rustup toolchain install "$MSRV" --profile minimal
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo install cargo-fuzz"
    cargo install --locked cargo-fuzz
fi
#   with miri and rust-src (miri, cargo-fuzz), cargo-fuzz itself, and cargo-deny (pinned);
#   for the C ABI (make c-test): cbindgen (pinned), pkg-config, and gcc/g++ with their
#   sanitizer runtimes.
log "tools ready"
