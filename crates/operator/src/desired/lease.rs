//! The Lease the producer replicas elect their leader with. The operator creates it without a
//! spec: the holder fields are the producers' (server-side apply leaves fields it never set
//! alone), and the producers need no `create`.

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::coordination::v1::Lease;

use super::metadata;

pub fn build(policy: &BurstPrefixPolicy) -> Lease {
    Lease {
        metadata: metadata(policy),
        spec: None,
    }
}
