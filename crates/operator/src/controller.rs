//! kube-runtime wiring: what is watched, and what triggers a policy's reconcile
//! ([`crate::reconcile`]).
//!
//! Every watch has its own backoff ([`burst_prefix_runtime::backoff`]) and reports refusals to
//! [`ApiAccess`]. Policies are watched through [`kube::core::DeserializeGuard`], so a policy
//! this operator cannot read becomes `InvalidConfig` instead of breaking the watch for every
//! policy, and through the generation predicate, so the operator's own status writes do not
//! trigger it again. Children are watched as metadata only, selected by the operator's label; pods as
//! metadata only, Running ones, optionally narrowed by `--pod-selector`.

use std::sync::Arc;

use burst_prefix_runtime::api_access::ApiAccess;
use burst_prefix_runtime::backoff::watch_backoff;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DynamicObject, ListParams};
use kube::core::{PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{predicates, watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::context::{key_of, Context};
use crate::desired::CHILD_SELECTOR;
use crate::error::{Error, Result};
use crate::pool_api;
use crate::reconcile::{error_policy, reconcile, Guarded};

/// Fails fast, with the fix, when the CRD is missing.
pub async fn check_crd(client: &Client, namespace: Option<&str>) -> Result<()> {
    let policies: Api<Guarded> = api(client, namespace);
    match policies.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing),
        Err(other) => Err(Error::Kube(other)),
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A watch stream with its own backoff, reporting refusals as `source`, whose errors stop
/// here: they are logged (a warning when a watch starts failing, then at debug level) and the
/// watch retries after its backoff. Passing them on would be worse than useless: the
/// Controller's own trigger backoff wraps the merged stream of every watch, so each error
/// would pause all watches, for longer and longer (0.8 s ... 40 s), which is what made the
/// recovery from an API server restart take up to ~45 s.
fn guarded<S, T>(
    stream: S,
    source: String,
    access: Arc<ApiAccess>,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send,
    T: Send,
{
    let mut failing = false;
    stream
        .inspect(move |item| {
            access.record_watch(&source, item);
            match item {
                Ok(_) if failing => {
                    failing = false;
                    info!(%source, "watch is back");
                }
                Ok(_) => {}
                Err(error) if !failing => {
                    failing = true;
                    warn!(%source, %error, "watch failed; retrying with backoff");
                }
                Err(error) => debug!(%source, %error, "watch failed again; retrying"),
            }
        })
        .backoff(watch_backoff())
        .filter(|item| futures::future::ready(item.is_ok()))
}

/// The metadata of one kind of child, selected by the operator's label.
fn children<K>(
    ctx: &Context,
    namespace: Option<&str>,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let source = format!(
        "watch {} in {}",
        K::plural(&()),
        namespace.unwrap_or("all namespaces")
    );
    guarded(
        watcher(
            api::<PartialObjectMeta<K>>(&ctx.client, namespace),
            watcher::Config::default().labels(CHILD_SELECTOR),
        ),
        source,
        ctx.access.clone(),
    )
    .touched_objects()
}

/// Runs one controller for `namespace` (`None`: all namespaces) until shutdown.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) -> Result<()> {
    let ns = namespace.as_deref();
    let scope = ns.unwrap_or("all namespaces").to_string();
    let (reader, writer) = reflector::store::<Guarded>();
    let policies = guarded(
        watcher(api::<Guarded>(&ctx.client, ns), watcher::Config::default()),
        format!("watch burstprefixpolicies in {scope}"),
        ctx.access.clone(),
    )
    .reflect(writer)
    .applied_objects()
    // Spec changes only: the operator's own status writes do not come back as triggers.
    .predicate_filter(predicates::generation, Default::default());

    let mut pod_config = watcher::Config::default().fields("status.phase=Running");
    if let Some(selector) = &ctx.settings.pod_selector {
        pod_config = pod_config.labels(selector);
    }
    let pods = guarded(
        watcher(api::<PartialObjectMeta<Pod>>(&ctx.client, ns), pod_config),
        format!("watch pods in {scope}"),
        ctx.access.clone(),
    )
    .touched_objects();
    let pod_store = reader.clone();
    let pod_ctx = ctx.clone();
    let pod_mapper = move |pod: PartialObjectMeta<Pod>| {
        let pod_namespace = pod.namespace();
        pod_store
            .state()
            .into_iter()
            .filter(|guarded| guarded.namespace() == pod_namespace)
            .filter(|guarded| {
                let Ok(policy) = &guarded.0 else { return false };
                match pod_ctx.selector_of(&key_of(policy)) {
                    Some(selector) => selector.matches(pod.labels()),
                    // Not resolved yet: a selector is parsed here, a pool's is unknown.
                    None => match (&policy.spec.pool_ref, &policy.spec.selector) {
                        (Some(_), _) => true,
                        (None, Some(selector)) => Selector::try_from(selector.clone())
                            .is_ok_and(|s| s.matches(pod.labels())),
                        (None, None) => false,
                    },
                }
            })
            .map(|guarded| ObjectRef::from_obj(&*guarded))
            .collect::<Vec<_>>()
    };

    let pool_resource = pool_api::resource();
    let pools_api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &pool_resource),
        None => Api::all_with(ctx.client.clone(), &pool_resource),
    };
    let pool_source = format!("watch inferencepools in {scope}");
    let pool_access = ctx.access.clone();
    let served = ctx.pool_api.clone();
    let pools = futures::stream::once(async move { served.served().await })
        .flat_map(move |()| {
            guarded(
                watcher(pools_api.clone(), watcher::Config::default()),
                pool_source.clone(),
                pool_access.clone(),
            )
        })
        .touched_objects();
    let pool_store = reader.clone();
    let pool_mapper = move |pool: DynamicObject| {
        pool_store
            .state()
            .into_iter()
            .filter(|guarded| {
                guarded.namespace() == pool.namespace()
                    && guarded.0.as_ref().is_ok_and(|policy| {
                        policy.spec.pool_ref.as_ref().map(|r| r.name.as_str())
                            == Some(pool.name_any().as_str())
                    })
            })
            .map(|guarded| ObjectRef::from_obj(&*guarded))
            .collect::<Vec<_>>()
    };

    info!(namespace = %scope, "starting controller");
    Controller::for_stream(policies, reader)
        .owns_stream(children::<ConfigMap>(&ctx, ns))
        .owns_stream(children::<ServiceAccount>(&ctx, ns))
        .owns_stream(children::<Role>(&ctx, ns))
        .owns_stream(children::<RoleBinding>(&ctx, ns))
        .owns_stream(children::<Service>(&ctx, ns))
        .owns_stream(children::<PodDisruptionBudget>(&ctx, ns))
        .owns_stream(children::<NetworkPolicy>(&ctx, ns))
        .owns_stream(children::<Deployment>(&ctx, ns))
        .watches_stream(pods, pod_mapper)
        .watches_stream_with(pools, pool_mapper, pool_resource)
        // When the InferencePool API appears, every policy is looked at again.
        .reconcile_all_on(ctx.pool_api.appearances())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                debug!(%error, "controller event");
            }
        })
        .await;
    Ok(())
}
