//! The thin apply layer: server-side apply with one field manager, forced, so a hand-edited
//! child is put back. A policy's children are applied all or nothing as far as the API server's
//! validation goes: every child built from the policy's content or the operator's flags
//! (ConfigMap, Service, PodDisruptionBudget, NetworkPolicy, Deployment) that changed is first applied as a dry run, and only when
//! the API server accepts all of them is anything applied for real. A refused policy leaves no
//! half of a new set of children behind. (A failure after the dry run, such as the API server
//! going away or refusing the operator a permission, can still leave some applied; the next
//! attempt completes them.)

use std::collections::HashMap;
use std::fmt::Debug;

use burst_prefix_api::policy::{BurstPrefixPolicy, BurstPrefixPolicyStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
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
            dry_run,
            source,
        })
}

/// Deletes `name` of kind `K` in `namespace` if it exists and this policy controls it (a
/// PodDisruptionBudget left from when the policy had more than one replica, a Lease from when
/// its replicas elected a leader, a NetworkPolicy from when the operator was given one).
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
        dry_run: false,
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
        Ok(_) => {
            tracing::info!(object = %what(), "deleted: the policy no longer asks for it");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Apply {
            object: what(),
            dry_run: false,
            source,
        }),
    }
}

/// What the API server last accepted of one policy's children (a hash of each child's serialized
/// form, by kind: a few hundred bytes per policy), so that the dry run covers only what changed
/// since: a pod churning changes only
/// the ConfigMap, and one dry run instead of six keeps its reconcile short. Empty after a
/// failure or a restart of the operator: everything is checked again then.
#[derive(Debug, Default)]
pub struct Accepted {
    objects: HashMap<String, u64>,
}

impl Accepted {
    fn unchanged<K: Resource<DynamicType = ()> + Serialize>(&self, object: &K) -> bool {
        self.objects.get(K::kind(&()).as_ref()) == Some(&serialized(object))
    }
}

/// In memory only (never persisted), so the standard hasher is fine.
fn serialized<K: Serialize>(object: &K) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(object)
        .expect("a child always serializes")
        .hash(&mut hasher);
    hasher.finish()
}

/// One child: a dry run unless it is unchanged since the API server accepted it, or the real
/// apply (recorded in `applied`).
async fn step<K>(
    client: &Client,
    object: &K,
    dry_run: bool,
    accepted: &Accepted,
    applied: &mut HashMap<String, u64>,
) -> Result<Option<K>>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    if dry_run && accepted.unchanged(object) {
        return Ok(None);
    }
    let stored = apply(client, object, dry_run).await?;
    if !dry_run {
        applied.insert(K::kind(&()).into_owned(), serialized(object));
    }
    Ok(Some(stored))
}

/// Applies every child: first as a dry run (the policy-derived ones that changed since the last
/// accepted apply), then for real (the RBAC and ConfigMap before the Deployment that uses
/// them); removes the optional children the policy no longer has. Returns the Deployment as stored (its status feeds
/// `ProducerAvailable`). `accepted` is updated on success and emptied on failure.
pub async fn apply_all(
    client: &Client,
    policy: &BurstPrefixPolicy,
    desired: &Desired,
    accepted: &mut Accepted,
) -> Result<Deployment> {
    let result = apply_all_once(client, policy, desired, accepted).await;
    match &result {
        Ok((_, applied)) => accepted.objects = applied.clone(),
        Err(_) => *accepted = Accepted::default(),
    }
    result.map(|(deployment, _)| deployment)
}

async fn apply_all_once(
    client: &Client,
    policy: &BurstPrefixPolicy,
    desired: &Desired,
    accepted: &Accepted,
) -> Result<(Deployment, HashMap<String, u64>)> {
    let mut applied = HashMap::new();
    let seen = &mut applied;
    // The dry run: the children whose content comes from the policy (its ports, image,
    // resources, scheduling, config), which the API server may refuse. The ServiceAccount, Role,
    // RoleBinding and Lease are the operator's alone; a RoleBinding cannot even be checked
    // before its Role exists (the API server resolves the Role to check the binder holds it).
    step(client, &desired.config_map, true, accepted, seen).await?;
    step(client, &desired.service, true, accepted, seen).await?;
    if let Some(budget) = &desired.pod_disruption_budget {
        step(client, budget, true, accepted, seen).await?;
    }
    if let Some(network_policy) = &desired.network_policy {
        step(client, network_policy, true, accepted, seen).await?;
    }
    step(client, &desired.deployment, true, accepted, seen).await?;
    // The real apply: identity and permissions first, the Deployment that uses them last.
    step(client, &desired.service_account, false, accepted, seen).await?;
    step(client, &desired.role, false, accepted, seen).await?;
    step(client, &desired.role_binding, false, accepted, seen).await?;
    step(client, &desired.config_map, false, accepted, seen).await?;
    if let Some(lease) = &desired.lease {
        step(client, lease, false, accepted, seen).await?;
    }
    step(client, &desired.service, false, accepted, seen).await?;
    if let Some(budget) = &desired.pod_disruption_budget {
        step(client, budget, false, accepted, seen).await?;
    }
    // Before the pods it selects are created or changed.
    if let Some(network_policy) = &desired.network_policy {
        step(client, network_policy, false, accepted, seen).await?;
    }
    let deployment = step(client, &desired.deployment, false, accepted, seen)
        .await?
        .expect("the real apply returns the Deployment");
    let namespace = desired.deployment.namespace().unwrap_or_default();
    let name = desired.deployment.name_any();
    // Looked for after a restart or a failure (nothing accepted yet), or when the policy had
    // one last time.
    let had = |kind: &str| accepted.objects.is_empty() || accepted.objects.contains_key(kind);
    if desired.pod_disruption_budget.is_none() && had("PodDisruptionBudget") {
        prune::<PodDisruptionBudget>(client, policy, &namespace, &name).await?;
    }
    if desired.lease.is_none() && had("Lease") {
        prune::<Lease>(client, policy, &namespace, &name).await?;
    }
    if desired.network_policy.is_none() && had("NetworkPolicy") {
        prune::<NetworkPolicy>(client, policy, &namespace, &name).await?;
    }
    Ok((deployment, applied))
}

/// Writes the status subresource of the policy `namespace/name`. The answer is read untyped: a
/// policy whose spec this operator cannot deserialize gets its status too.
pub async fn apply_status(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &BurstPrefixPolicyStatus,
) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<BurstPrefixPolicy>(&()),
    );
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
