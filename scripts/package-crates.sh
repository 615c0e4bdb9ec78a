#!/usr/bin/env bash
# `make package-crates`: the crates an engine depends on, packaged as crates.io would take
# them. `cargo package -p kvdrain -p kvdrain-driver` builds each .crate and verifies it by
# compiling the unpacked package on its own; kvdrain-driver's dependency on the
# not-yet-published kvdrain is resolved from the kvdrain .crate just made (cargo package puts
# workspace members together through a temporary local registry). Then each .crate must
# carry its README and LICENSE, and the manifest the metadata crates.io shows.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[package-crates] %s\n' "$*"; }
crates=(kvdrain kvdrain-driver)
version="$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["kvdrain"])')"
out="${CARGO_TARGET_DIR:-target}/package"

args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
# --allow-dirty: a developer's tree with uncommitted edits packages too (CI's clone is clean).
# --exclude-lockfile: these are libraries, whose users resolve their own lock; ours would
# record loom at vendor/loom (patched in by .cargo/config.toml), a path no user has.
log "cargo package ${args[*]}"
warnings="$(mktemp)"
trap 'rm -f "$warnings"' EXIT
status=0
cargo package "${args[@]}" --allow-dirty --exclude-lockfile 2>"$warnings" || status=$?
cat "$warnings" >&2
[ "$status" -eq 0 ] || exit "$status"
if grep -q "^warning: manifest has no" "$warnings"; then
    log "FAIL: a manifest lacks metadata crates.io asks for (see the warnings above)"
    exit 1
fi

for c in "${crates[@]}"; do
    crate="$out/$c-$version.crate"
    [ -f "$crate" ] || { log "FAIL: no $crate"; exit 1; }
    listing="$(tar -tzf "$crate")"
    for f in Cargo.toml README.md LICENSE src/lib.rs; do
        grep -qx "$c-$version/$f" <<<"$listing" || { log "FAIL: $crate lacks $f"; exit 1; }
    done
    manifest="$(tar -xzOf "$crate" "$c-$version/Cargo.toml")"
    for key in description license readme keywords categories repository documentation \
        '\[package.metadata.docs.rs\]'; do
        grep -q "^$key" <<<"$manifest" || { log "FAIL: $c's packaged manifest has no $key"; exit 1; }
    done
    log "$crate: $(wc -l <<<"$listing") files, $(du -k "$crate" | cut -f1) KiB, verified"
done
