//! Resolve and discover: where a policy's endpoints come from (its InferencePool, or its own
//! selector and ports), and the ready pods that are its endpoints now.

use burst_prefix_api::policy::{BurstPrefixPolicy, PoolRef};
use burst_prefix_api::Endpoint;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DynamicObject, ListParams};
use kube::core::Selector;
use kube::{Api, ResourceExt};

use crate::context::{key_of, Context};
use crate::endpoints::endpoints;
use crate::error::{Error, Result};
use crate::pool_api;

/// The pods a policy's endpoints are (its selector, or its InferencePool's) and their ports.
struct PodSelection {
    /// As the policy or its pool says it: what the producer's NetworkPolicy admits.
    labels: LabelSelector,
    selector: Selector,
    ports: Vec<i32>,
}

/// What discovery found for a policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Discovered {
    /// Its ready endpoints (docs/behaviour.md §6).
    pub endpoints: Vec<Endpoint>,
    /// The label selector of its inference pods, the policy's or its InferencePool's.
    pub engines: LabelSelector,
}

async fn resolve(ctx: &Context, policy: &BurstPrefixPolicy) -> Result<PodSelection> {
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
            pool_selection(name, &pool.data)?
        }
        (None, Some(selector)) => (
            selector.clone(),
            policy.spec.target_ports.iter().map(|p| p.number).collect(),
        ),
        (None, None) => (LabelSelector::default(), Vec::new()),
    };
    let parsed = Selector::try_from(selector.clone())
        .map_err(|e| Error::InvalidConfig(format!("selector: {e}")))?;
    Ok(PodSelection {
        labels: selector,
        selector: parsed,
        ports,
    })
}

/// An InferencePool v1's `spec.selector` and `spec.targetPorts`.
fn pool_selection(name: &str, data: &serde_json::Value) -> Result<(LabelSelector, Vec<i32>)> {
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

/// The ready endpoints of a policy (docs/behaviour.md §6) and the selector of its pods.
pub async fn discover(ctx: &Context, policy: &BurstPrefixPolicy) -> Result<Discovered> {
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
    Ok(Discovered {
        endpoints: endpoints(&list.items, &source.selector, &source.ports),
        engines: source.labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pool_selector_and_ports_are_read() {
        let (selector, ports) = pool_selection(
            "pool",
            &json!({"spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}, {"number": 8001}]}}),
        )
        .unwrap();
        assert_eq!(selector.match_labels.unwrap()["app"], "vllm");
        assert_eq!(ports, [8000, 8001]);
        let error = pool_selection("pool", &json!({"spec": {"targetPorts": []}})).unwrap_err();
        assert_eq!(error.to_string(), "InferencePool pool: no spec.selector");
    }
}
