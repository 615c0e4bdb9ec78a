//! Every harness runs on the committed seeds of its fuzz target (`fuzz/corpus/TARGET/seed-*`),
//! on stable and without libFuzzer: a seed that crashes a harness fails here first.

use std::fs;
use std::path::PathBuf;

/// The committed seeds of `target`, read; at least one must exist.
fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target);
    let mut seeds: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .map(|p| {
            let bytes = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Runs `harness` on every seed of `target`, on a thread with the 8 MiB stack the fuzzer's
/// main thread has (the `replay` harness builds small ledgers on the calling thread).
fn run(target: &'static str, harness: fn(&[u8])) {
    let seeds = seeds(target);
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || {
            for (path, bytes) in seeds {
                eprintln!("{target}: {}", path.display());
                harness(&bytes);
            }
        })
        .expect("spawn the harness thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn wire_seeds() {
    run("wire", kvdrain_fuzz_harness::wire);
}

#[test]
fn ledger_ops_seeds() {
    run("ledger_ops", kvdrain_fuzz_harness::ledger_ops);
}

#[test]
fn producer_plan_seeds() {
    run("producer_plan", kvdrain_fuzz_harness::producer_plan);
}

#[test]
fn replay_seeds() {
    run("replay", kvdrain_fuzz_harness::replay);
}
