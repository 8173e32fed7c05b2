//! Producer config texts (YAML or JSON) into the config store.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burst_prefix_fuzz::producer_config::check(data));
