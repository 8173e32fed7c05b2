//! ext_proc message streams (length-delimited protobuf) through the endpoint picker.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: burst_prefix_fuzz::write_seeds_if_asked(burst_prefix_fuzz::ext_proc::seeds),
    |data: &[u8]| burst_prefix_fuzz::ext_proc::check(data)
);
