//! The bench's reading of llama-server's answers, on answers recorded from the real engine
//! (tests/fixtures/; bench/engine/record_fixtures.py and the curl calls in its doc made them).

use burst_prefix_engine_bench::bound::lower_bound_per_step;
use burst_prefix_engine_bench::usage::{from_completion, from_sse, Timings, UsageError};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn a_cold_stream_computed_its_whole_prompt() {
    let usage = from_sse(&fixture("stream-cold.sse")).unwrap();
    assert_eq!((usage.prompt_tokens, usage.cached_tokens), (300, 0));
    assert_eq!(usage.computed_tokens(), 300);
    let timings = usage.timings.unwrap();
    assert_eq!((timings.cache_n, timings.prompt_n), (0, 300));
    assert!(timings.prompt_ms > 0.0);
}

#[test]
fn a_partial_hit_computes_only_the_new_suffix() {
    // The same replica had just computed a 300-token prompt sharing its first 200 tokens.
    let usage = from_sse(&fixture("stream-partial-hit.sse")).unwrap();
    assert_eq!((usage.prompt_tokens, usage.cached_tokens), (250, 200));
    assert_eq!(usage.computed_tokens(), 50);
    assert_eq!(
        usage.timings.map(|t| (t.cache_n, t.prompt_n)),
        Some((200, 50))
    );
}

#[test]
fn a_full_hit_still_computes_one_token() {
    let usage = from_completion(&fixture("completion-full-hit.json")).unwrap();
    assert_eq!((usage.prompt_tokens, usage.cached_tokens), (250, 249));
    assert_eq!(usage.computed_tokens(), 1);
}

#[test]
fn completions_of_text_and_default_streams_carry_usage_too() {
    let text = from_completion(&fixture("completion-text-cold.json")).unwrap();
    assert_eq!((text.prompt_tokens, text.cached_tokens), (23, 0));
    // Without stream_options, llama-server's completions stream still ends with usage.
    let default = from_sse(&fixture("stream-default.sse")).unwrap();
    assert_eq!((default.prompt_tokens, default.cached_tokens), (250, 249));
}

#[test]
fn errors_and_cut_streams_have_no_usage() {
    assert_eq!(
        from_completion(&fixture("error.json")),
        Err(UsageError::NoUsage)
    );
    // The stream cut before its last event (which carries usage and timings).
    let whole = String::from_utf8(fixture("stream-cold.sse")).unwrap();
    let cut: String = whole
        .lines()
        .filter(|line| !line.contains("\"usage\""))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(from_sse(cut.as_bytes()), Err(UsageError::NoUsage));
    assert!(matches!(
        from_completion(b"<html>502</html>"),
        Err(UsageError::NotJson(_))
    ));
}

#[test]
fn usage_and_timings_must_agree() {
    let body = br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4}},
                    "timings":{"cache_n":5,"prompt_n":5,"prompt_ms":1.0}}"#;
    assert!(matches!(
        from_completion(body),
        Err(UsageError::Disagree { cache_n: 5, .. })
    ));
    let body = br#"{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#;
    assert_eq!(
        from_completion(body),
        Err(UsageError::CachedBeyondPrompt {
            cached: 4,
            prompt: 3
        })
    );
    // No details (an engine without prefix caching): nothing cached.
    let usage = from_completion(br#"{"usage":{"prompt_tokens":7}}"#).unwrap();
    assert_eq!(
        (usage.computed_tokens(), usage.timings),
        (7, None::<Timings>)
    );
}

/// One fresh replica, prompts sent one at a time (record_fixtures.py): the engine's computed
/// tokens against the lower bound of the same steps.
#[test]
fn a_recorded_run_against_its_lower_bound() {
    let run: serde_json::Value = serde_json::from_slice(&fixture("sequential-run.json")).unwrap();
    let steps: Vec<Vec<Vec<u32>>> = serde_json::from_value(run["steps"].clone()).unwrap();
    let computed: Vec<Vec<u64>> = run["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| {
            step.as_array()
                .unwrap()
                .iter()
                .map(|answer| {
                    from_completion(answer.to_string().as_bytes())
                        .unwrap()
                        .computed_tokens()
                })
                .collect()
        })
        .collect();
    // Step 0: a (300), a again (a full hit: 1), a[..200] + b (50 new).
    // Step 1: c (100), a + d: the bound counts d's 40 only (a is known from step 0) ...
    assert_eq!(lower_bound_per_step(&steps, 1), vec![351, 140]);
    // ... but the engine computed 140 of it: serving a[..200] + b on a's slot kept 200 of a's
    // tokens and dropped the rest (llama.cpp saves a slot to its host cache only when a new
    // prompt keeps less than half of it), so a's last 100 tokens were computed again.
    assert_eq!(computed, vec![vec![300, 1, 50], vec![100, 140]]);
}
