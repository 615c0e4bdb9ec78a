#!/usr/bin/env bash
# `make c-header` (regenerate crates/kvdrain-ffi/include/kvdrain.h) and, with --verify,
# `make c-header-check` (fail when the committed header is not what cbindgen makes now).
# crates/kvdrain-ffi/cbindgen.toml names the version macros as @VERSION@, @MAJOR@, @MINOR@,
# @PATCH@: they are filled in here from the crate's version, so the header's
# KVDRAIN_VERSION and kvdrain_version() (env!("CARGO_PKG_VERSION")) are one number.
set -euo pipefail
cd "$(dirname "$0")/../crates/kvdrain-ffi"
verify=()
[ "${1:-}" = "--verify" ] && verify=(--verify)
version="$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["kvdrain-ffi"])')"
IFS=. read -r major minor patch <<<"${version%%[-+]*}"
config="$(mktemp)"
trap 'rm -f "$config"' EXIT
sed -e "s/@VERSION@/$version/" -e "s/@MAJOR@/$major/" -e "s/@MINOR@/$minor/" \
    -e "s/@PATCH@/$patch/" cbindgen.toml > "$config"
cbindgen -q --config "$config" --crate kvdrain-ffi "${verify[@]}" --output include/kvdrain.h
