//! kube-runtime wiring: what is watched, and the reconcile pipeline
//! validate → resolve → discover → build → apply → status.
//!
//! Every watch has its own backoff ([`burst_prefix_runtime::backoff`]) and reports refusals to
//! [`ApiAccess`]. Policies are watched through [`DeserializeGuard`], so a policy this operator
//! cannot read becomes `InvalidConfig` instead of breaking the watch for every policy, and
//! through the generation predicate, so the operator's own status writes do not trigger it
//! again. Children are watched as metadata only, selected by the operator's label; pods as
//! metadata only, Running ones, optionally narrowed by `--pod-selector`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use burst_prefix_api::policy::{BurstPrefixPolicy, BurstPrefixPolicyStatus, PoolRef};
use burst_prefix_api::Endpoint;
use burst_prefix_runtime::api_access::ApiAccess;
use burst_prefix_runtime::backoff::watch_backoff;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::{DeserializeGuard, PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{predicates, watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::apply::{apply_all, apply_status, Accepted};
use crate::backoff::RetryBackoff;
use crate::desired::{child_name, desired, producer_url, ProducerDefaults, CHILD_SELECTOR};
use crate::endpoints::endpoints;
use crate::error::{Error, ReconcileError, Result, Stage};
use crate::metrics::Metrics;
use crate::pool_api::{self, PoolApi};
use crate::status::{is_ready, status, Observed, Problem};
use crate::validate::{validate, ImagePolicy};

/// The [`ApiAccess`] source of the API calls reconciles make (besides the watches): refused
/// from the first 401/403 until any reconcile succeeds.
const RECONCILE: &str = "the operator's reconcile requests";

/// A policy as watched: its spec may not deserialize.
pub type Guarded = DeserializeGuard<BurstPrefixPolicy>;

/// What the operator's flags say about reconciling.
#[derive(Clone, Debug)]
pub struct Settings {
    pub producer: ProducerDefaults,
    pub images: ImagePolicy,
    /// `--pod-selector`: only pods with these labels are watched (and can be endpoints).
    pub pod_selector: Option<String>,
    /// How long a healthy policy waits before it is reconciled again anyway.
    pub resync: Duration,
}

/// State shared by reconciliations.
pub struct Context {
    pub client: Client,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub settings: Settings,
    pub backoff: RetryBackoff,
    pub pool_api: Arc<PoolApi>,
    pub access: Arc<ApiAccess>,
    /// The selector each policy resolved to last time (`namespace/name`), for the pod mapper.
    selectors: RwLock<HashMap<String, Selector>>,
    /// What the API server last accepted of each policy's children.
    accepted: Mutex<HashMap<String, Accepted>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Metrics,
        recorder: Recorder,
        settings: Settings,
        backoff: RetryBackoff,
        pool_api: Arc<PoolApi>,
        access: Arc<ApiAccess>,
    ) -> Self {
        Context {
            client,
            metrics,
            recorder,
            settings,
            backoff,
            pool_api,
            access,
            selectors: RwLock::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
        }
    }

    /// Taken out for one reconcile (kube-runtime never runs two for one policy at once).
    fn take_accepted(&self, key: &str) -> Accepted {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
            .unwrap_or_default()
    }

    fn keep_accepted(&self, key: String, accepted: Accepted) {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, accepted);
    }

    fn remember_selector(&self, key: &str, selector: &Selector) {
        self.selectors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), selector.clone());
    }

    fn selector_of(&self, key: &str) -> Option<Selector> {
        self.selectors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }
}

fn key_of<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

/// Where a policy's endpoints come from.
struct Source {
    selector: Selector,
    ports: Vec<i32>,
}

async fn resolve(ctx: &Context, policy: &BurstPrefixPolicy) -> Result<Source> {
    let namespace = policy.namespace().ok_or(Error::NoNamespace)?;
    let (selector, ports) = match (&policy.spec.pool_ref, &policy.spec.selector) {
        (Some(PoolRef { name }), _) => {
            if !ctx.pool_api.present() && !ctx.pool_api.check(&ctx.client).await {
                return Err(Error::PoolApiMissing {
                    recheck_seconds: ctx.pool_api.recheck.as_secs(),
                });
            }
            let pools: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &namespace, &pool_api::resource());
            let pool = pools
                .get_opt(name)
                .await
                .map_err(Error::Discovery)?
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
        Selector::try_from(selector).map_err(|e| Error::InvalidConfig(format!("selector: {e}")))?;
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

/// The ready endpoints of a policy (SPEC §6).
async fn discover(ctx: &Context, policy: &BurstPrefixPolicy) -> Result<Vec<Endpoint>> {
    let source = resolve(ctx, policy).await?;
    ctx.remember_selector(&key_of(policy), &source.selector);
    let pods: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    let mut labels = source.selector.to_string();
    if let Some(narrower) = &ctx.settings.pod_selector {
        labels = [labels.as_str(), narrower.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(",");
    }
    let list = pods
        .list(
            &ListParams::default()
                .labels(&labels)
                .fields("status.phase=Running"),
        )
        .await;
    ctx.access.record("list pods", &list);
    let list = list.map_err(|error| match error {
        // The API server refuses a selector Kubernetes cannot parse.
        kube::Error::Api(status) if status.code == 400 => {
            Error::InvalidConfig(format!("selector {labels:?}: {}", status.message))
        }
        other => Error::Discovery(other),
    })?;
    Ok(endpoints(&list.items, &source.selector, &source.ports))
}

fn problem(error: &Error) -> Problem {
    Problem {
        reason: error.reason(),
        message: error.to_string(),
    }
}

/// Records `error` on the stage it belongs to.
fn record_failure(observed: &mut Observed, error: &Error) {
    match error.stage() {
        Stage::Config => observed.config = Some(Err(problem(error))),
        Stage::Discovery => observed.endpoints = Some(Err(problem(error))),
        Stage::Apply => observed.applied = Some(Err(problem(error))),
        Stage::Other => {}
    }
}

/// validate → discover → build → apply, filling `observed` as far as it gets.
async fn pipeline(
    ctx: &Context,
    policy: &BurstPrefixPolicy,
    observed: &mut Observed,
) -> Result<()> {
    validate(policy, &ctx.settings.images)?;
    observed.config = Some(Ok(()));
    let found = discover(ctx, policy).await?;
    observed.endpoints = Some(Ok(found.len()));
    let children = desired(policy, found, &ctx.settings.producer);
    let key = key_of(policy);
    let mut accepted = ctx.take_accepted(&key);
    let applied = apply_all(&ctx.client, policy, &children, &mut accepted).await;
    ctx.keep_accepted(key, accepted);
    observed.deployment = Some(applied?);
    observed.applied = Some(Ok(()));
    Ok(())
}

async fn reconcile_policy(ctx: &Context, policy: &BurstPrefixPolicy) -> Result<Action> {
    let namespace = policy.namespace().ok_or(Error::NoNamespace)?;
    let mut observed = Observed {
        generation: policy.metadata.generation,
        producer_url: Some(producer_url(policy)),
        ..Observed::default()
    };
    let failure = pipeline(ctx, policy, &mut observed).await.err();
    if let Some(error) = &failure {
        record_failure(&mut observed, error);
        // The producer keeps running what was applied before: report that.
        if observed.deployment.is_none() {
            observed.deployment = Api::<Deployment>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&child_name(policy))
                .await
                .ok()
                .flatten();
        }
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = status(&observed, policy.status.as_ref(), now);
    if policy.status.as_ref() != Some(&new_status) {
        let written = apply_status(&ctx.client, &namespace, &policy.name_any(), &new_status).await;
        match (written, &failure) {
            (Ok(()), _) => {}
            // The failure that made this status matters more than failing to write it.
            (Err(error), Some(_)) => {
                if let Some(kube_error) = error.kube_error() {
                    ctx.access.failed(RECONCILE, kube_error);
                }
                warn!(policy = %key_of(policy), %error, "cannot write the status");
                return Err(failure.expect("matched Some"));
            }
            (Err(error), None) => return Err(error),
        }
        ctx.metrics
            .status_writes
            .with_label_values(&[] as &[&str])
            .inc();
        info!(policy = %key_of(policy), endpoints = new_status.endpoints, ready = is_ready(Some(&new_status)), "status updated");
        if is_ready(Some(&new_status)) && !is_ready(policy.status.as_ref()) {
            publish(
                ctx,
                &policy.object_ref(&()),
                EventType::Normal,
                "Ready",
                format!("producer serving at {}", producer_url(policy)),
            )
            .await;
        }
    }
    match failure {
        Some(error) => Err(error),
        // Everything that matters is watched; the periodic requeue only guards against missed
        // events.
        None => Ok(Action::requeue(ctx.settings.resync)),
    }
}

/// A policy whose spec does not deserialize: `InvalidConfig`, with serde's message.
async fn reconcile_unreadable(
    ctx: &Context,
    invalid: &kube::core::error_boundary::InvalidObject,
) -> Result<Action> {
    let error = Error::UnreadableSpec(invalid.error.clone());
    let mut observed = Observed {
        generation: invalid.metadata.generation,
        ..Observed::default()
    };
    record_failure(&mut observed, &error);
    let namespace = invalid
        .metadata
        .namespace
        .clone()
        .ok_or(Error::NoNamespace)?;
    let name = invalid.metadata.name.clone().unwrap_or_default();
    // The status may still be readable when the spec is not: keep its transition times.
    let untyped: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &namespace,
        &ApiResource::erase::<BurstPrefixPolicy>(&()),
    );
    let previous: Option<BurstPrefixPolicyStatus> = untyped
        .get_opt(&name)
        .await
        .ok()
        .flatten()
        .and_then(|object| serde_json::from_value(object.data.get("status")?.clone()).ok());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new_status = status(&observed, previous.as_ref(), now);
    if previous.as_ref() != Some(&new_status) {
        if let Err(write) = apply_status(&ctx.client, &namespace, &name, &new_status).await {
            warn!(policy = %format!("{namespace}/{name}"), error = %write, "cannot write the status");
        }
    }
    Err(error)
}

async fn publish(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        // Event notes are at most 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    // Not counted for readiness: Events are published only when something else already went
    // wrong, so a refused one would never be followed by a success that clears it.
    if let Err(error) = ctx.recorder.publish(&event, reference).await {
        warn!(%error, reason, "cannot publish an Event");
    }
}

pub async fn reconcile(guarded: Arc<Guarded>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let _timer = ctx.metrics.timer();
    let key = key_of(&*guarded);
    let result = match &guarded.0 {
        Ok(policy) => reconcile_policy(&ctx, policy).await,
        Err(invalid) => reconcile_unreadable(&ctx, invalid).await,
    };
    match result {
        Ok(action) => {
            ctx.backoff.succeeded(&key);
            ctx.access.allowed(RECONCILE);
            ctx.metrics.reconciliations.with_label_values(&["ok"]).inc();
            Ok(action)
        }
        Err(error) => {
            if let Some(kube_error) = error.kube_error() {
                ctx.access.failed(RECONCILE, kube_error);
            }
            let retry_in = ctx.backoff.failed(&key);
            warn!(policy = %key, reason = error.reason(), %error, retry_in_seconds = retry_in.as_secs_f64(), "reconcile failed");
            publish(
                &ctx,
                &guarded.object_ref(&()),
                EventType::Warning,
                error.reason(),
                error.to_string(),
            )
            .await;
            Err(ReconcileError { error, retry_in })
        }
    }
}

pub fn error_policy(_guarded: Arc<Guarded>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconciliations
        .with_label_values(&["error"])
        .inc();
    ctx.metrics
        .failures
        .with_label_values(&[error.error.metric_label()])
        .inc();
    Action::requeue(error.retry_in)
}

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
