#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvdrain_fuzz_harness::producer_plan(data));
