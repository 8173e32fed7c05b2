//! The thin apply layer: server-side apply with one field manager, forced, so a hand-edited
//! child is put back.

use std::fmt::Debug;

use burst_prefix_api::policy::{BurstPrefixPolicy, BurstPrefixPolicyStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::desired::Desired;
use crate::error::Result;
use crate::FIELD_MANAGER;

/// Applies one namespaced object and returns it as the API server stored it.
pub async fn apply<K>(client: &Client, object: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Serialize + DeserializeOwned + Clone + Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api
        .patch(&object.name_any(), &params, &Patch::Apply(object))
        .await?)
}

/// Applies every child, the ConfigMap and RBAC before the Deployment that uses them, and returns
/// the Deployment as stored (its status feeds `ProducerAvailable`).
pub async fn apply_all(client: &Client, desired: &Desired) -> Result<Deployment> {
    apply(client, &desired.config_map).await?;
    apply(client, &desired.service_account).await?;
    apply(client, &desired.role).await?;
    apply(client, &desired.role_binding).await?;
    apply(client, &desired.service).await?;
    apply(client, &desired.deployment).await
}

/// Writes the status subresource.
pub async fn apply_status(
    client: &Client,
    policy: &BurstPrefixPolicy,
    status: &BurstPrefixPolicyStatus,
) -> Result<()> {
    let api: Api<BurstPrefixPolicy> =
        Api::namespaced(client.clone(), &policy.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": BurstPrefixPolicy::api_version(&()),
        "kind": BurstPrefixPolicy::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&policy.name_any(), &params, &Patch::Apply(patch))
        .await?;
    Ok(())
}
