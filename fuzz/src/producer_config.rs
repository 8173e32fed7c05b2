//! The producer config parser (docs/behaviour.md §2, §11): text in, a valid config or a refusal
//! that says why out; through the producer's config store, a refusal leaves the last good config in
//! force, and an accepted config is one a request can be hashed and planned under.

use std::sync::Arc;

use burst_prefix_api::config::RULES;
use burst_prefix_api::producer_config::ProducerConfigError;
use burst_prefix_api::ProducerConfig;
use burst_prefix_core::config_store::{Applied, ConfigOrigin, ConfigStore};
use burst_prefix_core::metrics::Metrics;
use burst_prefix_core::read::HashedRequest;
use burst_prefix_core::read::InferenceRequest;

/// The config in force before the fuzzed text arrives.
const GOOD: &str = "endpoints:\n  - {id: ns/a-rank-0, address: '10.0.0.1:8000'}\n";

/// A request hashed under every accepted config, as a window would: text and token prompts.
const REQUEST: &[u8] =
    br#"{"model": "m", "prompt": ["You are a helpful assistant. Hello!", "x"], "cache_salt": "s"}"#;
const TOKENS: &[u8] = br#"{"model": "m", "prompt": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]}"#;

thread_local! {
    static METRICS: Arc<Metrics> = Arc::new(Metrics::new());
}

pub fn check(data: &[u8]) {
    // Both sources hand the store text: a file read as UTF-8, a ConfigMap's string data.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = ProducerConfig::from_yaml(text);
    assert_eq!(
        parsed,
        ProducerConfig::from_yaml(text),
        "parsing is deterministic"
    );
    match &parsed {
        Ok(config) => check_config(config),
        Err(error) => check_refusal(error),
    }

    // A fresh store (its generations start at 1); the metrics it counts into are shared, as
    // they only count.
    let metrics = METRICS.with(Arc::clone);
    let store = ConfigStore::new(ConfigOrigin::Demo, metrics);
    assert_eq!(store.apply_text(GOOD), Ok(Applied::Accepted(1)));
    let before = store.current().expect("a config is in force");
    let applied = store.apply_text(text);
    let now = store.current().expect("a config stays in force");
    match (&parsed, applied) {
        (Ok(config), Ok(Applied::Accepted(2))) => {
            assert_ne!(config, &before.config);
            assert_eq!((&now.config, now.generation), (config, 2));
        }
        (Ok(config), Ok(Applied::Unchanged(1))) => assert_eq!(config, &before.config),
        (Err(error), Err(refused)) => {
            assert_eq!(error, &refused, "the store refuses for the parser's reason");
            assert!(
                Arc::ptr_eq(&before, &now),
                "the last good config stays in force"
            );
        }
        (parsed, applied) => panic!("the store disagrees: {parsed:?} vs {applied:?}"),
    }
    // What a window does with the config in force: hash requests under it.
    for body in [REQUEST, TOKENS] {
        let request = InferenceRequest::parse(body).expect("a valid request");
        let hashed = HashedRequest::new(&request, now.settings.block_spec);
        assert!(!hashed.blocks.is_empty(), "a non-empty prompt has blocks");
        assert!(hashed.blocks.len() <= 2 * now.settings.block_spec.max_blocks.max(1));
    }
}

fn check_config(config: &ProducerConfig) {
    assert_eq!(config.validate(), Ok(()), "an accepted config is valid");
    let yaml = config.to_yaml();
    assert_eq!(
        ProducerConfig::from_yaml(&yaml).as_ref(),
        Ok(config),
        "the YAML the operator writes reads back the same:\n{yaml}"
    );
    let planner = &config.planner;
    let spec = planner.block_spec();
    assert_eq!(
        i64::try_from(spec.block_size_tokens),
        Ok(planner.block_size_tokens)
    );
    let _ = (
        planner.plan_params(),
        planner.memory_settings(),
        planner.idle_seal(),
        planner.max_batch_size(),
    );
}

fn check_refusal(error: &ProducerConfigError) {
    let text = error.to_string();
    match error {
        ProducerConfigError::Parse(reason) => {
            assert!(!reason.is_empty(), "a parse error says why");
            assert!(text.starts_with("cannot parse config: "), "{text}");
        }
        ProducerConfigError::Invalid(invalid) => {
            assert!(!invalid.0.is_empty(), "an invalid config breaks a rule");
            for violation in &invalid.0 {
                assert!(
                    RULES.iter().any(|rule| rule.field == violation.field)
                        || violation.field.starts_with("endpoints[]."),
                    "a violation names a field: {violation:?}"
                );
                assert!(text.contains(&violation.to_string()), "{text}");
            }
        }
    }
}
