//! kube-runtime wiring: what is watched, and the reconcile pipeline
//! resolve → validate → build → apply → status.

use std::sync::Arc;
use std::time::Duration;

use burst_prefix_api::policy::{BurstPrefixPolicy, PoolRef};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use crate::apply::{apply_all, apply_status};
use crate::desired::{desired, producer_url};
use crate::endpoints::endpoints;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::status::{status, Observed};

/// State shared by reconciliations.
pub struct Context {
    pub client: Client,
    pub metrics: Metrics,
}

/// The Gateway API Inference Extension pool kind.
pub fn inference_pool_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "inference.networking.k8s.io",
        "v1",
        "InferencePool",
    ))
}

/// Where a policy's endpoints come from.
struct Source {
    selector: Selector,
    ports: Vec<i32>,
}

async fn resolve(client: &Client, policy: &BurstPrefixPolicy) -> Result<Source> {
    let namespace = policy.namespace().ok_or(Error::NoNamespace)?;
    let (selector, ports) = match (&policy.spec.pool_ref, &policy.spec.selector) {
        (Some(PoolRef { name }), _) => {
            let pools: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &inference_pool_resource());
            let pool = pools
                .get_opt(name)
                .await?
                .ok_or_else(|| Error::PoolNotFound(format!("{namespace}/{name}")))?;
            pool_source(name, &pool.data)?
        }
        (None, Some(selector)) => (
            selector.clone(),
            policy.spec.target_ports.iter().map(|p| p.number).collect(),
        ),
        (None, None) => (LabelSelector::default(), Vec::new()),
    };
    let selector =
        Selector::try_from(selector).map_err(|e| Error::InvalidSelector(e.to_string()))?;
    Ok(Source { selector, ports })
}

/// An InferencePool v1's `spec.selector` and `spec.targetPorts`.
fn pool_source(name: &str, data: &serde_json::Value) -> Result<(LabelSelector, Vec<i32>)> {
    let invalid = |problem: &str| Error::InvalidPool {
        name: name.to_string(),
        problem: problem.to_string(),
    };
    let spec = data.get("spec").ok_or_else(|| invalid("no spec"))?;
    let selector: LabelSelector = serde_json::from_value(
        spec.get("selector")
            .cloned()
            .ok_or_else(|| invalid("no spec.selector"))?,
    )
    .map_err(|e| invalid(&format!("spec.selector: {e}")))?;
    let ports = spec
        .get("targetPorts")
        .and_then(|p| p.as_array())
        .ok_or_else(|| invalid("no spec.targetPorts"))?
        .iter()
        .filter_map(|p| p.get("number")?.as_i64())
        .map(|n| n as i32)
        .collect();
    Ok((selector, ports))
}

pub async fn reconcile(policy: Arc<BurstPrefixPolicy>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.timer();
    let client = &ctx.client;
    let namespace = policy.namespace().ok_or(Error::NoNamespace)?;

    let config = policy.spec.planner.validate().map_err(|e| e.to_string());
    let discovered = match resolve(client, &policy).await {
        Ok(source) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let list = pods
                .list(&ListParams::default().labels(&source.selector.to_string()))
                .await?;
            Ok(endpoints(&list.items, &source.selector, &source.ports))
        }
        Err(Error::Kube(e)) => return Err(Error::Kube(e)),
        Err(e) => Err(e.to_string()),
    };

    // An invalid config or a failed discovery leaves the children as they are: the producer
    // keeps serving its last good config.
    let deployment = match (&config, &discovered) {
        (Ok(()), Ok(found)) => Some(apply_all(client, &desired(&policy, found.clone())).await?),
        _ => {
            Api::<Deployment>::namespaced(client.clone(), &namespace)
                .get_opt(&crate::desired::child_name(&policy))
                .await?
        }
    };
    let observed = Observed {
        generation: policy.metadata.generation,
        config,
        endpoints: discovered.map(|found| found.len()),
        deployment,
        producer_url: producer_url(&policy),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = status(&observed, policy.status.as_ref(), now);
    if policy.status.as_ref() != Some(&new_status) {
        apply_status(client, &policy, &new_status).await?;
        ctx.metrics
            .status_writes
            .with_label_values(&[] as &[&str])
            .inc();
        info!(policy = %ObjectRef::from_obj(&*policy), endpoints = new_status.endpoints, "status updated");
    }
    ctx.metrics.reconciliations.with_label_values(&["ok"]).inc();
    // Everything that matters is watched; the periodic requeue only guards against missed events.
    Ok(Action::requeue(Duration::from_secs(300)))
}

pub fn error_policy(policy: Arc<BurstPrefixPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(policy = %ObjectRef::from_obj(&*policy), %error, "reconcile failed");
    ctx.metrics
        .reconciliations
        .with_label_values(&["error"])
        .inc();
    ctx.metrics
        .failures
        .with_label_values(&[error.metric_label()])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// The backoff of the controller's watches. kube-runtime's default (client-go's: up to 30 s plus
/// jitter, reset only after 120 s without errors) is shared by all eight watches here, so an
/// API server restart, which fails each of them a few times, left pod changes unseen for
/// minutes. Capped at 5 s, every watch is back within seconds of the server.
fn watch_backoff() -> impl kube::runtime::utils::Backoff {
    kube::runtime::watcher::ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    )
}

/// Fails fast, with the fix, when the CRD is missing.
pub async fn check_crd(policies: &Api<BurstPrefixPolicy>) -> Result<()> {
    match policies.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(Error::CrdMissing),
        Err(other) => Err(Error::Kube(other)),
    }
}

/// Runs the controller until the streams end. `namespace` limits every watch to one namespace.
pub async fn run(
    client: Client,
    metrics: Metrics,
    namespace: Option<String>,
    ready: Arc<std::sync::atomic::AtomicBool>,
) -> Result<()> {
    fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let policies: Api<BurstPrefixPolicy> = api(&client, &namespace);
    check_crd(&policies).await?;
    let pool_api_present = kube::discovery::pinned_kind(
        &client,
        &GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool"),
    )
    .await
    .is_ok();
    info!(
        pool_api_present,
        namespace = namespace.as_deref().unwrap_or("<all>"),
        "starting controller"
    );

    let config = watcher::Config::default();
    let controller = Controller::new(policies, config.clone()).trigger_backoff(watch_backoff());
    let store = controller.store();
    let pod_store = store.clone();
    let mut controller = controller
        .owns(api::<ConfigMap>(&client, &namespace), config.clone())
        .owns(api::<Deployment>(&client, &namespace), config.clone())
        .owns(api::<Service>(&client, &namespace), config.clone())
        .owns(api::<ServiceAccount>(&client, &namespace), config.clone())
        .owns(api::<Role>(&client, &namespace), config.clone())
        .owns(api::<RoleBinding>(&client, &namespace), config.clone())
        .watches(
            api::<Pod>(&client, &namespace),
            config.clone(),
            move |pod| {
                let pod_namespace = pod.namespace();
                pod_store
                    .state()
                    .into_iter()
                    .filter(|policy| policy.namespace() == pod_namespace)
                    .filter(
                        |policy| match (&policy.spec.pool_ref, &policy.spec.selector) {
                            // The pool's selector is resolved in reconcile: any pod of the namespace may
                            // matter.
                            (Some(_), _) => true,
                            (None, Some(selector)) => Selector::try_from(selector.clone())
                                .is_ok_and(|s| s.matches(pod.labels())),
                            (None, None) => false,
                        },
                    )
                    .map(|policy| ObjectRef::from_obj(&*policy))
                    .collect::<Vec<_>>()
            },
        );
    if pool_api_present {
        let pools: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &inference_pool_resource()),
            None => Api::all_with(client.clone(), &inference_pool_resource()),
        };
        let pool_store = store.clone();
        controller =
            controller.watches_with(pools, inference_pool_resource(), config, move |pool| {
                pool_store
                    .state()
                    .into_iter()
                    .filter(|policy| {
                        policy.namespace() == pool.namespace()
                            && policy.spec.pool_ref.as_ref().map(|r| r.name.as_str())
                                == Some(pool.name_any().as_str())
                    })
                    .map(|policy| ObjectRef::from_obj(&*policy))
                    .collect::<Vec<_>>()
            });
    }
    let context = Arc::new(Context { client, metrics });
    // Ready once the CRD is there and the watches are set up.
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(%error, "controller event");
            }
        })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pool_selector_and_ports_are_read() {
        let (selector, ports) = pool_source(
            "pool",
            &json!({"spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}, {"number": 8001}]}}),
        )
        .unwrap();
        assert_eq!(selector.match_labels.unwrap()["app"], "vllm");
        assert_eq!(ports, [8000, 8001]);
        let error = pool_source("pool", &json!({"spec": {"targetPorts": []}})).unwrap_err();
        assert_eq!(error.to_string(), "InferencePool pool: no spec.selector");
    }
}
