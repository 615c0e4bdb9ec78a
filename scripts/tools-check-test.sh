#!/usr/bin/env bash
# Run by `make tools-check`: proves scripts/tools-check.py can fail. On a temporary copy of
# the Makefile, .ci/run and scripts/, the check must succeed as it does on the repository;
# then each mutation below (an install step deleted, or a new tool called) must make it
# exit non-zero and name the missing tool.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log() { printf '[tools-check-test] %s\n' "$*"; }

fresh_copy() {
    rm -rf "$work/repo"
    mkdir -p "$work/repo/crates/kvdrain-python"
    cp -a "$root/Makefile" "$root/.ci" "$root/scripts" "$work/repo/"
    cp -a "$root"/crates/kvdrain-python/constraints.txt "$work/repo/crates/kvdrain-python/"
}

# delete_line FILE FIXED-STRING: removes the lines holding it; fails if there are none, so a
# renamed step cannot turn a mutation into a no-op.
delete_line() {
    local file="$work/repo/$1" needle=$2
    grep -qF -- "$needle" "$file" || { log "FAIL: '$needle' not in $1"; exit 1; }
    grep -vF -- "$needle" "$file" > "$file.new"
    mv "$file.new" "$file"
}

# expect_failure WHAT MESSAGE: the checker must exit non-zero and print MESSAGE.
expect_failure() {
    local what=$1 message=$2 out rc=0
    out="$(python3 "$work/repo/scripts/tools-check.py" --root "$work/repo" 2>&1)" || rc=$?
    if [ "$rc" -eq 0 ]; then
        log "FAIL: tools-check passed with $what"
        exit 1
    fi
    grep -qF -- "$message" <<<"$out" || {
        printf '%s\n' "$out"
        log "FAIL: with $what, tools-check did not report: $message"
        exit 1
    }
    log "ok: $what -> exit $rc"
    grep -m 1 -F -- "$message" <<<"$out" | sed "s/^/    /"
}

fresh_copy
python3 "$work/repo/scripts/tools-check.py" --root "$work/repo" >/dev/null
log "ok: the unmodified copy passes"

fresh_copy
delete_line scripts/setup-tools.sh 'cargo install --locked --force cbindgen'
expect_failure "the cbindgen install step deleted" 'command `cbindgen`'

fresh_copy
delete_line scripts/setup-tools.sh 'cargo install --locked --force cargo-deny'
expect_failure "the cargo-deny install step deleted" '`cargo deny` (binary cargo-deny)'

fresh_copy
delete_line scripts/setup-tools.sh 'cargo install --locked --force cargo-fuzz'
expect_failure "the cargo-fuzz install step deleted" '`cargo fuzz` (binary cargo-fuzz)'

fresh_copy
delete_line scripts/setup-tools.sh 'rustup target add thumbv7em-none-eabihf'
expect_failure "the no_std target's install step deleted" 'target `thumbv7em-none-eabihf`'

fresh_copy
delete_line scripts/setup-tools.sh 'rustup toolchain install "$MSRV"'
expect_failure "the MSRV toolchain's install step deleted" 'toolchain `1.87`'

fresh_copy
delete_line scripts/setup-tools.sh 'rustup toolchain install "$NIGHTLY"'
expect_failure "the nightly's install step deleted" 'toolchain `nightly-'

fresh_copy
delete_line scripts/setup-tools.sh 'missing_apt+=(pkg-config)'
expect_failure "the pkg-config apt step deleted" 'command `pkg-config`'

fresh_copy
delete_line scripts/setup-python.sh '        maturin \'
expect_failure "maturin dropped from the venv's install" 'command `maturin`'

fresh_copy
printf '\nclang-build:\n\tclang -O2 -c x.c\n' >> "$work/repo/Makefile"
expect_failure "a new Makefile recipe calling clang" 'command `clang`'

log "every mutation failed the check"
