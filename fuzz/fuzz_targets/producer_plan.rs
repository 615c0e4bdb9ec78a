#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvdrain_model::producer_plan(data));
