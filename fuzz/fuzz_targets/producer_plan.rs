#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvdrain::fuzzing::producer_plan(data));
