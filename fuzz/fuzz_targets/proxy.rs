//! Requests through the proxy's router (route, headers, body), and the headers it forwards.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burst_prefix_fuzz::proxy::check(data));
