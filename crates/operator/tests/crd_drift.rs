//! The checked-in CRD YAML (crds/ and the chart's copy) must be what the Rust types generate.
//! Fix a failure with `make crds`.

use std::path::Path;

fn repo_file(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make crds`", path.display()))
}

#[test]
fn checked_in_crd_matches_the_code() {
    let generated = burst_prefix_api::policy::crd_yaml();
    for copy in [
        "crds/burstprefixpolicies.yaml",
        "charts/burst-prefix/files/crds/burstprefixpolicies.yaml",
    ] {
        assert!(
            repo_file(copy) == generated,
            "{copy} drifted from crates/api/src/policy.rs: run `make crds` and commit"
        );
    }
}
