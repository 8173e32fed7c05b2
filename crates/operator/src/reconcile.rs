//! The reconcile pipeline: validate → discover → build → apply → status, one policy at a time.
//! Every failure is recorded on the stage it belongs to, becomes a condition reason and a
//! Warning Event, and is retried with this policy's backoff; the status is written only when it
//! changes.

use std::sync::Arc;

use burst_prefix_api::policy::{BurstPrefixPolicy, BurstPrefixPolicyStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use crate::apply::{apply_all, apply_status};
use crate::context::{key_of, Context};
use crate::desired::{child_name, desired, producer_url};
use crate::discover::discover;
use crate::error::{Error, ReconcileError, Result, Stage};
use crate::status::{is_ready, status, Observed, Problem};
use crate::validate::validate;

/// The [`ApiAccess`] source of the API calls reconciles make (besides the watches): refused
/// from the first 401/403 until any reconcile succeeds.
const RECONCILE: &str = "the operator's reconcile requests";

/// A policy as watched: its spec may not deserialize.
pub type Guarded = DeserializeGuard<BurstPrefixPolicy>;

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
    observed.endpoints = Some(Ok(found.endpoints.len()));
    let children = desired(
        policy,
        found.endpoints,
        &found.engines,
        &ctx.settings.producer,
    );
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
        ha: policy.spec.producer.ha,
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
