# kvdrain — the two commands of the README's quick start are `make demo` and `make test`.
# Both install what they need first (idempotent).

CARGO ?= cargo
LOOM_TARGET := target/loom
FUZZ_SECONDS ?= 20
# NIGHTLY (miri, cargo-fuzz) and MSRV (the core's rust-version), pinned in one place.
include scripts/toolchains
export NIGHTLY

.PHONY: demo test setup setup-nixl setup-tools check fmt clippy clippy-cfg doc unit release-suites nostd msrv loom miri fuzz-smoke replay

## The main job: P(TP=2) -> D(TP=1) over real NIXL in one process.
demo: setup-nixl
	$(CARGO) run --release -p kvdrain-cli --features nixl -- demo $(DEMO_ARGS)

## Every test and check CI runs.
test: setup check unit release-suites nostd msrv loom miri fuzz-smoke
	@echo "make test: all suites passed"

setup: setup-nixl setup-tools

setup-nixl:
	bash scripts/setup-nixl.sh

setup-tools:
	bash scripts/setup-tools.sh

check: fmt clippy clippy-cfg doc

fmt:
	$(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

## The core's code behind cfgs a plain build never compiles: the fuzz harnesses
## (`--cfg fuzzing`) and the loom models (`--cfg kvdrain_loom`), each in its own target dir.
clippy-cfg:
	RUSTFLAGS="--cfg fuzzing" CARGO_TARGET_DIR=target/clippy-fuzzing \
		$(CARGO) clippy -p kvdrain --lib -- -D warnings
	RUSTFLAGS="--cfg kvdrain_loom" CARGO_TARGET_DIR=$(LOOM_TARGET) \
		$(CARGO) clippy --release -p kvdrain --tests -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features

## Unit, grid, trace, scenario, simulation, real-NIXL integration tests.
unit:
	$(CARGO) test --workspace --all-features

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

## The core's unit tests under miri.
miri:
	$(CARGO) +$(NIGHTLY) miri test -p kvdrain --lib

## Build every fuzz target and run each for FUZZ_SECONDS.
fuzz-smoke:
	bash scripts/fuzz-smoke.sh $(FUZZ_SECONDS)

replay:
	$(CARGO) run --release --bin kvdrain -- replay $(TRACE)
