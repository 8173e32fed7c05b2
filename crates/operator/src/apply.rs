//! The thin apply layer: server-side apply with one field manager, forced, so a hand-edited
//! child is put back. A policy's children are applied all or nothing as far as the API server's
//! validation goes: every child is first applied as a dry run, and only when the API server
//! accepts all of them are they applied for real. A refused policy leaves no half of a new set
//! of children behind (a failure between the dry run and the apply, such as the API server going
//! away, can still leave some applied; the next attempt completes them).

use std::fmt::Debug;

use burst_prefix_api::policy::{BurstPrefixPolicy, BurstPrefixPolicyStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::desired::Desired;
use crate::error::{Error, Result};
use crate::FIELD_MANAGER;

/// `Kind namespace/name`, as the failure message names an object.
fn describe<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Applies one namespaced object (or only checks it, with `dry_run`) and returns it as the API
/// server stored (or would store) it.
async fn apply<K>(client: &Client, object: &K, dry_run: bool) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.dry_run = dry_run;
    api.patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
        .map_err(|source| Error::Apply {
            object: describe(object),
            source,
        })
}

/// Deletes `name` of kind `K` in `namespace` if it exists and this policy controls it (a
/// PodDisruptionBudget or Lease left from when the policy had more than one replica).
async fn prune<K>(
    client: &Client,
    policy: &BurstPrefixPolicy,
    namespace: &str,
    name: &str,
) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let what = || format!("{} {namespace}/{name}", K::kind(&()));
    let Some(existing) = api.get_opt(name).await.map_err(|source| Error::Apply {
        object: what(),
        source,
    })?
    else {
        return Ok(());
    };
    let ours = existing
        .owner_references()
        .iter()
        .any(|owner| owner.controller == Some(true) && Some(&owner.uid) == policy.uid().as_ref());
    if !ours {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Apply {
            object: what(),
            source,
        }),
    }
}

/// Applies every child: first all as a dry run, then for real (the ConfigMap and RBAC before
/// the Deployment that uses them); removes the optional children the policy no longer has.
/// Returns the Deployment as stored (its status feeds `ProducerAvailable`).
pub async fn apply_all(
    client: &Client,
    policy: &BurstPrefixPolicy,
    desired: &Desired,
) -> Result<Deployment> {
    for dry_run in [true, false] {
        apply(client, &desired.config_map, dry_run).await?;
        apply(client, &desired.service_account, dry_run).await?;
        apply(client, &desired.role, dry_run).await?;
        apply(client, &desired.role_binding, dry_run).await?;
        if let Some(lease) = &desired.lease {
            apply(client, lease, dry_run).await?;
        }
        apply(client, &desired.service, dry_run).await?;
        if let Some(budget) = &desired.pod_disruption_budget {
            apply(client, budget, dry_run).await?;
        }
        let deployment = apply(client, &desired.deployment, dry_run).await?;
        if !dry_run {
            let namespace = desired.deployment.namespace().unwrap_or_default();
            let name = desired.deployment.name_any();
            if desired.pod_disruption_budget.is_none() {
                prune::<PodDisruptionBudget>(client, policy, &namespace, &name).await?;
            }
            if desired.lease.is_none() {
                prune::<Lease>(client, policy, &namespace, &name).await?;
            }
            return Ok(deployment);
        }
    }
    unreachable!("the loop returns after the real apply")
}

/// Writes the status subresource of the policy `namespace/name`.
pub async fn apply_status(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &BurstPrefixPolicyStatus,
) -> Result<()> {
    let api: Api<BurstPrefixPolicy> = Api::namespaced(client.clone(), namespace);
    let patch = json!({
        "apiVersion": BurstPrefixPolicy::api_version(&()),
        "kind": BurstPrefixPolicy::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(patch))
        .await
        .map_err(Error::Status)?;
    Ok(())
}
