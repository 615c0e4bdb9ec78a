# kvdrain — the two commands of the README's quick start are `make demo` and `make test`.
# Both install what they need first (idempotent).

CARGO ?= cargo
PREFIX ?= /usr/local
LOOM_TARGET := target/loom
FUZZ_SECONDS ?= 20
# NIGHTLY (miri, cargo-fuzz) and MSRV (the core's rust-version), pinned in one place.
include scripts/toolchains
export NIGHTLY

.PHONY: tools-check package package-crates package-python
.PHONY: demo test setup setup-nixl setup-tools check fmt clippy clippy-cfg doc deny unit release-suites nostd msrv loom miri fuzz-smoke replay python python-test vllm mypy-vllm test-vllm test-vllm-releases test-nixl-threads test-vllm-e2e test-vllm-topo vllm-compat bench-vllm bench-python c-header c-header-check c-test install

## The main job: P(TP=2) -> D(TP=1) over real NIXL in one process.
demo: setup-nixl
	$(CARGO) run --release -p kvdrain-cli --features nixl -- demo $(DEMO_ARGS)

## Every test and check CI runs.
test: setup check unit release-suites nostd msrv loom miri fuzz-smoke python-test test-vllm-releases test-nixl-threads test-vllm-e2e test-vllm-topo c-test package
	@echo "make test: all suites passed"

setup: setup-nixl setup-tools

setup-nixl:
	bash scripts/setup-nixl.sh

setup-tools:
	bash scripts/setup-tools.sh

check: fmt clippy clippy-cfg doc deny docs-check tools-check

fmt:
	$(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

## The core's code behind a cfg a plain build never compiles: the loom models
## (`--cfg kvdrain_loom`), in their own target dir. (The fuzz harnesses are the
## `kvdrain-fuzz-harness` crate, which `clippy` covers.)
clippy-cfg:
	RUSTFLAGS="--cfg kvdrain_loom" CARGO_TARGET_DIR=$(LOOM_TARGET) \
		$(CARGO) clippy --release -p kvdrain --tests -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features

## Dependency policy (deny.toml): licenses, bans, sources; no advisory database. cargo-deny
## reads the whole lock file, every platform's crates included, from the local registry
## cache: `cargo fetch` (all targets when none is named) fills it on a fresh machine, then
## the check runs `--frozen` (offline, lock file unchanged).
deny:
	$(CARGO) fetch --locked
	$(CARGO) deny --frozen check licenses bans sources

## Every catalogue id cited resolves in docs/protocol.md; no issue numbers, passes or
## links to documents outside the repository (scripts/check-docs.py, and its self-test).
.PHONY: docs-check
docs-check:
	python3 scripts/check-docs.py --self-test
	python3 scripts/check-docs.py

## Unit, grid, trace, scenario, simulation, real-NIXL integration tests.
## Every feature but the core's `defmt` (a no_std logging backend, built by `nostd`): the
## binding crates are shared libraries, and defmt's symbol names break their linker
## version script.
unit:
	$(CARGO) test --workspace --features kvdrain-cli/nixl

## At full size, in release: the two-thread stress test (millions of notices) and the
## simulation at 10^5 requests per topology with every fault class firing.
release-suites:
	$(CARGO) test --release -p kvdrain-tests --test stress --test sim -- --include-ignored

## The core is no_std without alloc: it builds for a Cortex-M4F, with and without defmt.
nostd:
	$(CARGO) build -p kvdrain --target thumbv7em-none-eabihf --no-default-features
	$(CARGO) build -p kvdrain --target thumbv7em-none-eabihf --features defmt

## The core builds with its declared minimum Rust (`rust-version`).
msrv:
	$(CARGO) +$(MSRV) build -p kvdrain

## Every race model, in release mode (own target dir: RUSTFLAGS differ).
loom:
	RUSTFLAGS="--cfg kvdrain_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=$(LOOM_TARGET) \
		$(CARGO) test --release -p kvdrain --test loom

## The core's unit tests under miri, and the C ABI's unsafe code driven through its
## extern "C" functions (a 64-request table under miri: crates/kvdrain-ffi/src/config.rs).
miri:
	$(CARGO) +$(NIGHTLY) miri test -p kvdrain --lib
	$(CARGO) +$(NIGHTLY) miri test -p kvdrain-ffi --lib --test from_rust

## Build every fuzz target and run each for FUZZ_SECONDS.
fuzz-smoke:
	bash scripts/fuzz-smoke.sh $(FUZZ_SECONDS)

## The C ABI (crates/kvdrain-ffi): regenerate the committed header after changing the crate.
c-header: setup-tools
	bash scripts/c-header.sh

## Fails when crates/kvdrain-ffi/include/kvdrain.h is not what cbindgen generates now.
c-header-check: setup-tools
	bash scripts/c-header.sh --verify

## Header check, the C catalogue under ASan+UBSan, the C++ example, the README example,
## and the catalogue against an installed copy through pkg-config.
c-test: setup-tools
	bash scripts/c-test.sh

## Installs kvdrain.h, libkvdrain.a, libkvdrain.so and kvdrain.pc under PREFIX.
install:
	bash scripts/c-install.sh "$(PREFIX)"

replay:
	$(CARGO) run --release --bin kvdrain -- replay $(TRACE)

## The Python module: build the abi3 wheel and install it into .venv/ (created, with
## maturin, pytest, mypy and hypothesis from PyPI, if missing), plus the release
## `kvdrain` binary its replay-agreement test calls.
VENV := .venv
# The Python package (its tests: tests/unit, tests/vllm, tests/vllm_e2e).
PY := crates/kvdrain-python
python:
	bash scripts/setup-python.sh

## pytest (warnings as errors) against the installed wheel, then mypy --strict on the
## stubs, the package, the examples and the tests.
python-test: python
	cd $(PY) && ../../$(VENV)/bin/python -m pytest -q tests/unit
	cd $(PY) && ../../$(VENV)/bin/mypy

## The vLLM releases the plugin supports (its gate, kvdrain/vllm/_gate.py, names the same),
## and the one a vLLM target runs on: VLLM=X.Y.Z picks another (default: the newest). Each
## release has its own environment, .venv-vllm-X.Y.Z/ (for the pin of constraints.txt a
## link to .venv-vllm/), all filled by uv from one cache by hard links
## (scripts/setup-vllm.sh).
VLLM_RELEASES := 0.33.0 0.34.0
VLLM ?= 0.34.0
VLLM_VENV = .venv-vllm-$(VLLM)

## The vLLM test environment of release VLLM: vllm, nixl, pytest and mypy from PyPI
## (about 10 GB for the first release, the vLLM wheel for each other; skipped once
## installed) and the wheel `make python` built.
vllm: python
	bash scripts/setup-vllm.sh $(VLLM)

## mypy --strict, in $(VLLM_VENV), over the plugin and the vLLM suites (tests/vllm/,
## tests/vllm_e2e/, tests/nixl_threads/ and what they share, tests/conftest.py, tests/vllm_cpu.py and
## tests/vllm_compat.py); vLLM's, torch's and NIXL's own sources are not followed
## ($(PY)/pyproject.toml).
mypy-vllm: vllm
	cd $(PY) && ../../$(VLLM_VENV)/bin/python -m mypy python/kvdrain tests/conftest.py tests/vllm_cpu.py tests/vllm_compat.py tests/vllm tests/vllm_e2e tests/nixl_threads

## The connector plugin (kvdrain.vllm.connector) on release VLLM's real scheduler and push
## worker classes, every scenario through the plugin and through vLLM's own connector
## (directed cases, the randomized check with its oracle, the prefill+decode randomized
## check, the metrics' scrape, the version gate); mypy over the vLLM suites first.
test-vllm: vllm mypy-vllm
	cd $(PY) && ../../$(VLLM_VENV)/bin/python -m pytest -q tests/vllm

## test-vllm on every release of VLLM_RELEASES, one after the other.
test-vllm-releases:
	for release in $(VLLM_RELEASES); do $(MAKE) test-vllm VLLM=$$release || exit 1; done

## A vLLM release against the plugin (VLLM=X.Y.Z, any release on PyPI): builds its
## environment, prints the gate's comparison (every signature and attribute the plugin
## relies on, each difference), runs the directed suite (tests/vllm/ but the randomized
## check) with the gate reporting instead of refusing, and says what differs
## (scripts/vllm-compat.sh). Fails unless the release is supported and all of it holds.
vllm-compat: python
	bash scripts/vllm-compat.sh $(VLLM)

## vLLM's NIXL agent across vLLM's threads, on real NIXL (two processes, UCX over TCP on
## loopback): a handshake thread evicting and re-adding the peer in use while a writer
## and an engine thread use it. vLLM's own agent configuration (NIXL_THREAD_SYNC_NONE,
## the control) must crash or misbehave; the plugin's (STRICT, RW) must stay clean
## (docs/limits.md). About 20 s; 150 s with three busy loops outranking it on 2 cores.
test-nixl-threads: vllm
	cd $(PY) && ../../$(VLLM_VENV)/bin/python -m pytest -q tests/nixl_threads

## End to end over real NIXL, on release VLLM (the newest unless named; `make
## test-vllm-e2e VLLM=0.33.0` for the older): a P and a D engine, each in its own process
## with vLLM's connector classes (the plugin's, and vLLM's own as the negative control), vLLM's
## handshake on free loopback ports, UCX over TCP; every fault, one JSON line per run in
## target/vllm-e2e/report.jsonl (docs/vllm.md, "End to end over real NIXL").
## Then completion, reuse and a post failure again over UCX's own on-host transports
## (shared memory and CMA), in target/vllm-e2e/report-shm.jsonl.
test-vllm-e2e: vllm
	cd $(PY) && ../../$(VLLM_VENV)/bin/python -m pytest -q tests/vllm_e2e/test_e2e.py
	cd $(PY) && KVDRAIN_E2E_TRANSPORT=shm \
		KVDRAIN_E2E_REPORT=../../target/vllm-e2e/report-shm.jsonl \
		../../$(VLLM_VENV)/bin/python -m pytest -q tests/vllm_e2e/test_e2e.py -k "completion or reuse or post_failure"

## End to end with every rank its own process (tests/vllm_e2e/test_topologies.py), on
## release VLLM (the newest unless named): P TP=2
## -> D TP=1, TP=1 -> TP=2, TP=2 -> TP=2, TP=4 -> TP=2, an MLA model TP=2 -> TP=1, P PP=2
## -> D TP=1, each rank a process in its engine's gloo group with its own NIXL agent and
## DRAM cache; the seed's three scenarios (10 runs on TP 2->1, 3 on the others), an abort
## on D while every edge writes and a P rank killed mid-write, through the plugin and
## vLLM's own connector; one JSON line per run in target/vllm-e2e/topologies.jsonl, the table in
## pytest's summary (docs/vllm.md, "Every rank its own process").
## TOPO_ARGS passes pytest arguments (`-k tp2-tp1`, say); empty by default, every run.
TOPO_ARGS ?=
test-vllm-topo: vllm
	cd $(PY) && ../../$(VLLM_VENV)/bin/python -m pytest -q tests/vllm_e2e/test_topologies.py $(TOPO_ARGS)

## The plugin's cost per engine step and per notification next to vLLM's own path
## (release VLLM).
bench-vllm: vllm
	$(VLLM_VENV)/bin/python bench/python/bench_vllm.py $(BENCH_VLLM_ARGS)

## Per-notification cost from Python next to vLLM's Python counting path, same bytes.
bench-python: python
	$(VENV)/bin/python bench/python/bench_python.py $(BENCH_PYTHON_ARGS)

## ---- a fresh machine, and the release artefacts ---------------------------------------
## (tools-check, package: one block, kept together)

## Every tool the Makefile, .ci/run and scripts/ call is on the base image
## (scripts/base-image.txt) or installed by a scripts/setup-*.sh; then proof that the check
## fails when an install step is deleted (scripts/tools-check-test.sh, on a temporary copy).
tools-check:
	python3 scripts/tools-check.py
	bash scripts/tools-check-test.sh

## The release artefacts, built and installed the way a user gets them: the crates an
## engine depends on (`cargo package`), the Python wheel and sdist (installed into a new
## virtualenv outside the tree and imported there). `make install` is run by c-test.
package: package-crates package-python

package-crates:
	bash scripts/package-crates.sh

package-python: python
	bash scripts/package-python.sh
