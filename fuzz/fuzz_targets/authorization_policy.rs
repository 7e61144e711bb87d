#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dubbo_cp::fuzzing::authorization_policy(data));
