#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvdrain_fuzz_harness::ledger_ops(data));
