#!/usr/bin/env bash
# `make c-test`: the C ABI end to end.
#   1. the committed header is what cbindgen generates now (fails when stale);
#   2. crates/kvdrain-ffi/tests/catalogue.c against the static library, under AddressSanitizer and
#      UndefinedBehaviorSanitizer (the Rust library is built normally, in release); then
#      crates/kvdrain-ffi/tests/hammer.c, sanitized too, for HAMMER_SECONDS (20) in all, and
#      crates/kvdrain-ffi/tests/alloc_limit.c (out of memory), unsanitized;
#   3. the C++ RAII example (crates/kvdrain-ffi/examples/raii.cpp), sanitized too;
#   4. the README's "Use from C/C++" example, extracted and compiled as written;
#   5. `make install` (the Makefile's target itself) into a temporary PREFIX, then the
#      catalogue again, built only with `pkg-config --cflags --libs kvdrain` against the
#      installed shared library.
set -euo pipefail
cd "$(dirname "$0")/.."
CC="${CC:-cc}"
CXX="${CXX:-g++}"
log() { printf '[c-test] %s\n' "$*"; }

log "header up to date (cbindgen --verify)"
bash scripts/c-header.sh --verify || {
    echo "crates/kvdrain-ffi/include/kvdrain.h is stale: run 'make c-header' and commit it" >&2
    exit 1
}

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
grep -qx "#define KVDRAIN_VERSION \"$version\"" crates/kvdrain-ffi/include/kvdrain.h || {
    echo "crates/kvdrain-ffi/include/kvdrain.h: KVDRAIN_VERSION is not the crate version $version" >&2
    exit 1
}

cargo build --release -p kvdrain-ffi
lib="${CARGO_TARGET_DIR:-target}/release/libkvdrain_ffi.a"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
san=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
libs=(-lpthread -ldl -lm -lrt -lutil)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

log "catalogue.c, static library, ASan+UBSan"
"$CC" -std=c11 -g -O1 -Wall -Wextra -Werror "${san[@]}" -Icrates/kvdrain-ffi/include \
    crates/kvdrain-ffi/tests/catalogue.c "$lib" "${libs[@]}" -o "$work/catalogue"
"$work/catalogue"

log "hammer.c (free orders with racing calls, garbage, two threads on one half), ASan+UBSan"
"$CC" -std=c11 -g -O1 -Wall -Wextra -Werror "${san[@]}" -Icrates/kvdrain-ffi/include \
    crates/kvdrain-ffi/tests/hammer.c "$lib" "${libs[@]}" -o "$work/hammer"
"$work/hammer" "${HAMMER_SECONDS:-20}"

log "alloc_limit.c: kvdrain_ledger_new under RLIMIT_AS returns KVDRAIN_ERR_ALLOC (no sanitizer)"
"$CC" -std=c11 -g -O1 -Wall -Wextra -Werror -D_DEFAULT_SOURCE -Icrates/kvdrain-ffi/include \
    crates/kvdrain-ffi/tests/alloc_limit.c "$lib" "${libs[@]}" -o "$work/alloc_limit"
"$work/alloc_limit"

log "examples/raii.cpp, ASan+UBSan"
"$CXX" -std=c++17 -g -O1 -Wall -Wextra -Werror "${san[@]}" -Icrates/kvdrain-ffi/include \
    crates/kvdrain-ffi/examples/raii.cpp "$lib" "${libs[@]}" -o "$work/raii"
"$work/raii"

log "README example, as written"
awk '/^## Use from C\/C\+\+/ { section = 1; next }
     section && /^## / { exit }
     section && /^```c$/ { code = 1; next }
     code && /^```$/ { exit }
     code { print }' README.md > "$work/readme.c"
test -s "$work/readme.c" || { echo "no \`\`\`c block under '## Use from C/C++' in README.md" >&2; exit 1; }
"$CC" -std=c11 -g -O1 -Wall -Wextra -Werror "${san[@]}" -Icrates/kvdrain-ffi/include \
    "$work/readme.c" "$lib" "${libs[@]}" -o "$work/readme"
"$work/readme"

log "make install PREFIX=$work/prefix, then pkg-config --cflags --libs kvdrain"
make -s install PREFIX="$work/prefix" >/dev/null
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
read -r -a pc <<<"$(pkg-config --cflags --libs kvdrain)"
libdir="$(pkg-config --variable=libdir kvdrain)"
"$CC" -std=c11 -O2 -Wall -Wextra -Werror crates/kvdrain-ffi/tests/catalogue.c "${pc[@]}" -lpthread \
    -Wl,-rpath,"$libdir" -o "$work/catalogue-installed"
# Not `ldd | grep -q`: grep exits at the first match, and under pipefail the SIGPIPE that
# ldd may then get fails the pipeline.
linked="$(ldd "$work/catalogue-installed")"
grep -q "libkvdrain.so.0 => $libdir/" <<<"$linked" || {
    echo "catalogue-installed is not linked against $libdir/libkvdrain.so.0" >&2
    exit 1
}
"$work/catalogue-installed"
log "all C ABI checks passed"
