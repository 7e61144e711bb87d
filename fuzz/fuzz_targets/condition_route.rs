#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dubbo_cp::fuzzing::condition_route(data));
