#!/usr/bin/env bash
# `make install PREFIX=...`: builds kvdrain-ffi in release and installs the C ABI:
#   PREFIX/include/kvdrain.h
#   PREFIX/lib/libkvdrain.a
#   PREFIX/lib/libkvdrain.so.VERSION, .so.MAJOR (its soname) and .so
#   PREFIX/lib/pkgconfig/kvdrain.pc
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:?usage: c-install.sh PREFIX}"
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

cargo build --release -p kvdrain-ffi
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
major="${version%%.*}"
target="${CARGO_TARGET_DIR:-target}/release"

install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 crates/kvdrain-ffi/include/kvdrain.h "$prefix/include/kvdrain.h"
install -m 644 "$target/libkvdrain_ffi.a" "$prefix/lib/libkvdrain.a"
install -m 755 "$target/libkvdrain_ffi.so" "$prefix/lib/libkvdrain.so.$version"
ln -sf "libkvdrain.so.$version" "$prefix/lib/libkvdrain.so.$major"
ln -sf "libkvdrain.so.$major" "$prefix/lib/libkvdrain.so"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/kvdrain-ffi/kvdrain.pc.in \
    > "$prefix/lib/pkgconfig/kvdrain.pc"
echo "[c-install] kvdrain $version installed under $prefix"
