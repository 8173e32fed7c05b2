//! Pure status: from what reconcile observed and applied to the policy's status. Transition
//! times are kept while a condition holds, so an unchanged world gives an identical status and
//! no write.

use burst_prefix_api::policy::BurstPrefixPolicyStatus;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// What one reconcile found.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub generation: Option<i64>,
    /// `Err` holds why the config was refused (field, value, rule).
    pub config: Result<(), String>,
    /// Endpoints written to the ConfigMap, or why none could be discovered.
    pub endpoints: Result<usize, String>,
    /// The producer Deployment as the API server returned it, if applied.
    pub deployment: Option<Deployment>,
    pub producer_url: String,
}

struct Verdict {
    type_: &'static str,
    ok: bool,
    reason: &'static str,
    message: String,
}

/// The status for `observed`, keeping `previous` transition times of unchanged conditions.
pub fn status(
    observed: &Observed,
    previous: Option<&BurstPrefixPolicyStatus>,
    now: Time,
) -> BurstPrefixPolicyStatus {
    let config = match &observed.config {
        Ok(()) => Verdict {
            type_: "ConfigValid",
            ok: true,
            reason: "Valid",
            message: "the config passed validation".into(),
        },
        Err(problem) => Verdict {
            type_: "ConfigValid",
            ok: false,
            reason: "InvalidConfig",
            message: format!("{problem}; the producer keeps its last good config"),
        },
    };
    let endpoints = match &observed.endpoints {
        Ok(0) => Verdict {
            type_: "EndpointsDiscovered",
            ok: false,
            reason: "NoReadyPods",
            message: "no selected pod is Ready with an IP".into(),
        },
        Ok(n) => Verdict {
            type_: "EndpointsDiscovered",
            ok: true,
            reason: "Discovered",
            message: format!("{n} endpoints from ready pods"),
        },
        Err(problem) => Verdict {
            type_: "EndpointsDiscovered",
            ok: false,
            reason: "DiscoveryFailed",
            message: problem.clone(),
        },
    };
    let producer = producer_verdict(observed.deployment.as_ref());
    let ready = if config.ok && endpoints.ok && producer.ok {
        Verdict {
            type_: "Ready",
            ok: true,
            reason: "Ready",
            message: format!("producer serving at {}", observed.producer_url),
        }
    } else {
        let first = [&config, &endpoints, &producer]
            .into_iter()
            .find(|v| !v.ok)
            .expect("one verdict failed");
        Verdict {
            type_: "Ready",
            ok: false,
            reason: first.reason,
            message: format!("{}: {}", first.type_, first.message),
        }
    };
    let conditions = [ready, config, endpoints, producer]
        .into_iter()
        .map(|verdict| condition(verdict, observed.generation, previous, &now))
        .collect();
    BurstPrefixPolicyStatus {
        observed_generation: observed.generation,
        conditions,
        endpoints: *observed.endpoints.as_ref().unwrap_or(&0) as i64,
        producer_url: Some(observed.producer_url.clone()),
    }
}

fn producer_verdict(deployment: Option<&Deployment>) -> Verdict {
    let verdict = |ok, reason, message: String| Verdict {
        type_: "ProducerAvailable",
        ok,
        reason,
        message,
    };
    let Some(deployment) = deployment else {
        return verdict(
            false,
            "NotApplied",
            "the producer Deployment was not applied".into(),
        );
    };
    let status = deployment.status.clone().unwrap_or_default();
    let available = status.available_replicas.unwrap_or(0);
    let wanted = deployment.spec.replicas.unwrap_or(1);
    if available >= 1 {
        verdict(
            true,
            "Available",
            format!("{available}/{wanted} producer replicas available"),
        )
    } else if wanted == 0 {
        verdict(false, "ScaledToZero", "spec.producer.replicas is 0".into())
    } else {
        verdict(
            false,
            "Unavailable",
            format!("0/{wanted} producer replicas available"),
        )
    }
}

fn condition(
    verdict: Verdict,
    generation: Option<i64>,
    previous: Option<&BurstPrefixPolicyStatus>,
    now: &Time,
) -> Condition {
    let status = if verdict.ok { "True" } else { "False" };
    let last_transition_time = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == verdict.type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: verdict.type_.to_string(),
        status: status.to_string(),
        reason: verdict.reason.to_string(),
        message: verdict.message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn time(seconds: i64) -> Time {
        serde_json::from_value(json!(format!("2026-01-01T00:00:{seconds:02}Z"))).unwrap()
    }

    fn available_deployment(available: i32) -> Deployment {
        serde_json::from_value(json!({
            "spec": {"replicas": 1, "selector": {}, "template": {}},
            "status": {"availableReplicas": available},
        }))
        .unwrap()
    }

    fn observed() -> Observed {
        Observed {
            generation: Some(3),
            config: Ok(()),
            endpoints: Ok(3),
            deployment: Some(available_deployment(1)),
            producer_url: "http://rl-producer.ml.svc:8080".into(),
        }
    }

    fn get<'a>(status: &'a BurstPrefixPolicyStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn all_good_is_ready() {
        let status = status(&observed(), None, time(1));
        assert_eq!(status.endpoints, 3);
        assert_eq!(status.observed_generation, Some(3));
        for type_ in [
            "Ready",
            "ConfigValid",
            "EndpointsDiscovered",
            "ProducerAvailable",
        ] {
            assert_eq!(get(&status, type_).status, "True", "{type_}");
        }
    }

    #[test]
    fn invalid_config_is_not_ready_with_reason() {
        let observed = Observed {
            config: Err("maxPerReplica is 0, but must be -1 (unlimited) or >= 1".into()),
            ..observed()
        };
        let status = status(&observed, None, time(1));
        assert_eq!(get(&status, "Ready").status, "False");
        assert_eq!(get(&status, "Ready").reason, "InvalidConfig");
        assert!(get(&status, "ConfigValid")
            .message
            .contains("maxPerReplica is 0"));
    }

    #[test]
    fn no_endpoints_and_unavailable_producer_are_reported() {
        let observed = Observed {
            endpoints: Ok(0),
            deployment: Some(available_deployment(0)),
            ..observed()
        };
        let status = status(&observed, None, time(1));
        assert_eq!(get(&status, "EndpointsDiscovered").reason, "NoReadyPods");
        assert_eq!(get(&status, "ProducerAvailable").reason, "Unavailable");
        assert_eq!(get(&status, "Ready").reason, "NoReadyPods");
    }

    #[test]
    fn unchanged_world_gives_identical_status() {
        let first = status(&observed(), None, time(1));
        let second = status(&observed(), Some(&first), time(9));
        assert_eq!(first, second);
        let changed = status(
            &Observed {
                endpoints: Ok(0),
                ..observed()
            },
            Some(&first),
            time(9),
        );
        assert_eq!(
            get(&changed, "EndpointsDiscovered").last_transition_time,
            time(9)
        );
        assert_eq!(get(&changed, "ConfigValid").last_transition_time, time(1));
    }
}
