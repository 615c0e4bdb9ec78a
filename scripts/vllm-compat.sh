#!/usr/bin/env bash
# How a vLLM release stands with the plugin, in minutes: `make vllm-compat VLLM=X.Y.Z`.
#   1. that release's environment (scripts/setup-vllm.sh X.Y.Z: uv, the shared cache);
#   2. the gate's comparison (crates/kvdrain-python/tests/vllm_compat.py): every signature
#      and attribute the plugin relies on, each difference printed;
#   3. the directed suite (tests/vllm/ but the randomized check) on that release, with the
#      gate reporting instead of refusing (pytest plugin vllm_compat), so that a release
#      outside the supported set still shows which scenarios hold;
#   4. one summary line. Exit status 0 only when the release is supported, nothing
#      differs and the suite passes; every step runs and prints first.
# Works from any cwd. The kvdrain wheel comes from `make python` (target/wheels-python/).
set -uo pipefail

log() { printf '[vllm-compat] %s\n' "$*"; }

release="${1:?usage: vllm-compat.sh X.Y.Z}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup-vllm.sh "$release" || { log "vLLM $release: no environment"; exit 1; }
venv="${VLLM_VENV:-$root/.venv-vllm-$release}"  # as scripts/setup-vllm.sh names it
installed="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')"

cd crates/kvdrain-python
log "the gate's comparison (vLLM $installed, $venv)"
"$venv/bin/python" tests/vllm_compat.py
gate=$?

log "the directed suite on vLLM $installed"
start=$(date +%s)
PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q -rfE -p vllm_compat tests/vllm \
    --ignore tests/vllm/test_randomized.py
suite=$?
took=$(( $(date +%s) - start ))

verdict="supported, nothing differs"
[[ $gate -ne 0 ]] && verdict="the gate finds differences (above)"
if [[ $suite -eq 0 ]]; then
    suite_text="directed suite passed (${took} s)"
else
    suite_text="directed suite failed (exit $suite, ${took} s; failures above)"
fi
log "vLLM $installed: $verdict; $suite_text"
if [[ $gate -ne 0 ]]; then
    exit 1
fi
exit "$suite"
