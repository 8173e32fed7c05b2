//! Request bodies (completions / chat completions JSON) into prompts and prefix blocks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = burst_prefix_fuzz::request_body::check(data);
});
