#!/usr/bin/env bash
# Install the Rust tooling the full test suite uses, idempotently:
#   rustfmt, clippy, the thumbv7em-none-eabihf target (no_std proof), the pinned nightly
#   with miri and rust-src (miri, cargo-fuzz), the core's minimum Rust (`make msrv`),
#   cargo-fuzz itself and cargo-deny (pinned); for the C ABI (make c-test): cbindgen
#   (pinned), pkg-config, and gcc/g++ with their sanitizer runtimes; gdb, which the vLLM
#   plugin's NIXL watchdog runs for native stacks where py-spy is missing. The pinned
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

# Cargo tools, each pinned: cargo install builds them from crates.io (minutes each on a
# fresh machine), so the check compares versions, not mere presence. Each install is
# written out in full, so that a reader (and any checker) sees which crate is installed.
# pinned VERSION COMMAND...: COMMAND runs and prints VERSION.
pinned() { local version=$1; shift; "$@" 2>/dev/null | grep -qF "$version"; }
pinned "$CARGO_FUZZ_VERSION" cargo fuzz --version ||
    cargo install --locked --force cargo-fuzz --version "$CARGO_FUZZ_VERSION"
# `make deny` (licenses, bans, sources); deny.toml follows this version's format.
pinned "$CARGO_DENY_VERSION" cargo deny --version ||
    cargo install --locked --force cargo-deny --version "$CARGO_DENY_VERSION"
# `make c-header`, `make c-test`: the committed header is this version's output.
pinned "$CBINDGEN_VERSION" cbindgen --version ||
    cargo install --locked --force cbindgen --version "$CBINDGEN_VERSION"
for bin in cargo-fuzz cargo-deny cbindgen; do
    command -v "$bin" >/dev/null 2>&1 || { log "ERROR: $bin not on PATH after install"; exit 1; }
done

# The C ABI's tests: pkg-config, gcc and g++ (libasan/libubsan come with gcc); gdb.
missing_apt=()
command -v pkg-config >/dev/null 2>&1 || missing_apt+=(pkg-config)
command -v cc >/dev/null 2>&1 || missing_apt+=(gcc)
command -v g++ >/dev/null 2>&1 || missing_apt+=(g++)
# The NIXL watchdog's second stack tool (and its unit test's native section).
command -v gdb >/dev/null 2>&1 || missing_apt+=(gdb)
if [ "${#missing_apt[@]}" -gt 0 ]; then
    log "apt-get install ${missing_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing_apt[@]}"
fi

log "tools ready"
