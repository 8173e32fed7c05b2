//! Engine `/metrics` texts into the load parser and the speed learner.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| burst_prefix_fuzz::engine_metrics::check(data));
