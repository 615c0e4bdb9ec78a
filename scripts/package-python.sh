#!/usr/bin/env bash
# `make package-python`: the Python package as a user gets it.
#   1. `maturin build --release --sdist`: the source distribution, then the abi3 wheel
#      built from that sdist (so the sdist is proven to build);
#   2. the sdist carries what building it needs (pyproject.toml, the binding crate and the
#      core crate it depends on, the lock file), and both carry the license;
#   3. a NEW virtualenv in a temporary directory outside the tree, the wheel installed
#      into it from the file alone (no index), and, from that directory, `import kvdrain`
#      must load the installed copy and report the crates' version.
# Needs .venv (make python) for maturin.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { printf '[package-python] %s\n' "$*"; }
venv="$root/.venv"
dist="${CARGO_TARGET_DIR:-$root/target}/dist-python"
version="$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["kvdrain-python"])')"

log "maturin build --release --sdist (version $version)"
rm -rf "$dist"
"$venv/bin/maturin" build --quiet --release --sdist --manifest-path crates/kvdrain-python/Cargo.toml \
    --interpreter "$venv/bin/python" --out "$dist"
wheel="$(ls "$dist"/kvdrain-"$version"-*.whl)"
sdist="$dist/kvdrain-$version.tar.gz"
case "$(basename "$wheel")" in
    *-abi3-*) ;;
    *) log "FAIL: $(basename "$wheel") is not an abi3 wheel"; exit 1 ;;
esac
[ -f "$sdist" ] || { log "FAIL: no sdist $sdist"; exit 1; }
# Not `| grep -q`: grep exits at the first match, and under pipefail the writer's SIGPIPE
# would fail the pipeline.
contents="$(python3 -m zipfile -l "$wheel")"
grep -q "kvdrain-$version.dist-info/licenses/LICENSE" <<<"$contents" || {
    log "FAIL: $(basename "$wheel") carries no LICENSE"
    exit 1
}

listing="$(tar -tzf "$sdist")"
for f in PKG-INFO pyproject.toml LICENSE Cargo.lock crates/kvdrain-python/Cargo.toml crates/kvdrain-python/src/lib.rs \
    crates/kvdrain/Cargo.toml crates/kvdrain/src/lib.rs; do
    grep -q "^kvdrain-$version/\(.*/\)\?$f$" <<<"$listing" || {
        log "FAIL: $(basename "$sdist") lacks $f"
        exit 1
    }
done
log "$(basename "$sdist"): $(wc -l <<<"$listing") files"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "new virtualenv in $work, wheel $(basename "$wheel")"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"
cd "$work"
got="$("$work/venv/bin/python" -c '
import pathlib, sys
import kvdrain
here = pathlib.Path(kvdrain.__file__).resolve()
assert pathlib.Path(sys.prefix).resolve() in here.parents, here
ledger = kvdrain.Ledger(capacity=4)
ledger.register("r", blocks=[1], expect=1)
ledger.feed({"P0": [b"r:1"]})
kinds = [d.kind for d in ledger.poll()]
assert kinds == ["completed"], kinds
print(kvdrain.__version__)
')"
[ "$got" = "$version" ] || { log "FAIL: the installed wheel says $got, the crates $version"; exit 1; }
log "the installed wheel imports outside the tree: kvdrain.__version__ == $got"
