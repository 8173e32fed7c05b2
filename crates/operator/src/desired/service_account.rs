//! The producer's own identity: whatever its Role grants is all it may do.

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::core::v1::ServiceAccount;

use super::metadata;

pub fn build(policy: &BurstPrefixPolicy) -> ServiceAccount {
    ServiceAccount {
        metadata: metadata(policy),
        ..ServiceAccount::default()
    }
}
