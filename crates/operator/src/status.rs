//! Pure status: from what reconcile observed and applied to the policy's status. Each stage of
//! the pipeline (config → endpoints → apply → producer) has a condition; a stage that failed
//! says why in its reason and message, later stages say what they are waiting for, and `Ready`
//! carries the first failure's reason. Transition times are kept while a condition holds, so an
//! unchanged world gives an identical status and no write.

use burst_prefix_api::policy::{BurstPrefixPolicyStatus, HaMode};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Why a stage failed: the condition reason and a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

/// What one reconcile found; `None` for a stage that was not reached.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Observed {
    pub generation: Option<i64>,
    pub config: Option<Result<(), Problem>>,
    /// Endpoints written to the ConfigMap.
    pub endpoints: Option<Result<usize, Problem>>,
    pub applied: Option<Result<(), Problem>>,
    /// The producer Deployment as the API server returned it (applied now, or as it stands).
    pub deployment: Option<Deployment>,
    pub producer_url: Option<String>,
    /// The policy's `spec.producer.ha`: how many producer replicas are meant to be Ready.
    pub ha: HaMode,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    True,
    False,
    Unknown,
}

struct Verdict {
    type_: &'static str,
    state: State,
    reason: &'static str,
    message: String,
    /// A failure of the pipeline (as opposed to waiting for pods or the Deployment): `Ready`
    /// names a failure before anything it waits for.
    failed: bool,
}

impl Verdict {
    fn new(type_: &'static str, state: State, reason: &'static str, message: String) -> Self {
        Verdict {
            type_,
            state,
            reason,
            message,
            failed: false,
        }
    }

    fn failure(type_: &'static str, problem: &Problem, message: String) -> Self {
        Verdict {
            failed: true,
            ..Verdict::new(type_, State::False, problem.reason, message)
        }
    }
}

/// The status for `observed`, keeping `previous` transition times of unchanged conditions.
pub fn status(
    observed: &Observed,
    previous: Option<&BurstPrefixPolicyStatus>,
    now: Time,
) -> BurstPrefixPolicyStatus {
    let config = match &observed.config {
        Some(Ok(())) => Verdict::new(
            "ConfigValid",
            State::True,
            "Valid",
            "the config passed validation".into(),
        ),
        Some(Err(problem)) => Verdict::new(
            "ConfigValid",
            State::False,
            problem.reason,
            format!(
                "{}; the producer keeps its last good config",
                problem.message
            ),
        ),
        None => Verdict::new(
            "ConfigValid",
            State::Unknown,
            "NotChecked",
            "not checked yet".into(),
        ),
    };
    let endpoints = match &observed.endpoints {
        Some(Ok(0)) => Verdict::new(
            "EndpointsDiscovered",
            State::False,
            "NoReadyPods",
            "no selected pod is Ready with an IP".into(),
        ),
        Some(Ok(n)) => Verdict::new(
            "EndpointsDiscovered",
            State::True,
            "Discovered",
            format!("{n} endpoints from ready pods"),
        ),
        Some(Err(problem)) => Verdict::failure(
            "EndpointsDiscovered",
            problem,
            format!("{}; the producer keeps its last endpoints", problem.message),
        ),
        None => Verdict::new(
            "EndpointsDiscovered",
            State::Unknown,
            "WaitingForValidConfig",
            "endpoints are discovered once the config is valid".into(),
        ),
    };
    let producer = match &observed.applied {
        Some(Err(problem)) => Verdict::failure(
            "ProducerAvailable",
            problem,
            format!(
                "{}; the producer keeps running what it had",
                problem.message
            ),
        ),
        _ => producer_verdict(observed.deployment.as_ref(), observed.ha),
    };
    let stages = [&config, &endpoints, &producer];
    let first_false = stages
        .iter()
        .find(|v| v.state == State::False && v.failed)
        .or_else(|| stages.iter().find(|v| v.state == State::False));
    let ready = match first_false {
        None if [&config, &endpoints, &producer]
            .iter()
            .all(|v| v.state == State::True) =>
        {
            Verdict::new(
                "Ready",
                State::True,
                "Ready",
                format!(
                    "producer serving at {}",
                    observed.producer_url.as_deref().unwrap_or("?")
                ),
            )
        }
        None => Verdict::new(
            "Ready",
            State::Unknown,
            "Reconciling",
            "not every stage was checked yet".into(),
        ),
        Some(first) => Verdict::new(
            "Ready",
            State::False,
            first.reason,
            format!("{}: {}", first.type_, first.message),
        ),
    };
    let conditions = [ready, config, endpoints, producer]
        .into_iter()
        .map(|verdict| condition(verdict, observed.generation, previous, &now))
        .collect();
    let endpoints = match &observed.endpoints {
        Some(Ok(n)) => *n as i64,
        // The ConfigMap still holds the last endpoints written.
        _ => previous.map(|p| p.endpoints).unwrap_or(0),
    };
    BurstPrefixPolicyStatus {
        observed_generation: observed.generation,
        conditions,
        endpoints,
        producer_url: observed.producer_url.clone(),
    }
}

fn producer_verdict(deployment: Option<&Deployment>, ha: HaMode) -> Verdict {
    let verdict =
        |state, reason, message: String| Verdict::new("ProducerAvailable", state, reason, message);
    let Some(deployment) = deployment else {
        return verdict(
            State::False,
            "NotApplied",
            "the producer is applied once the config is valid and endpoints are discovered".into(),
        );
    };
    let status = deployment.status.clone().unwrap_or_default();
    let available = status.available_replicas.unwrap_or(0);
    let wanted = deployment.spec.replicas.unwrap_or(1);
    // How many are meant to be Ready (docs/behaviour.md §10): with leader election only the
    // leader; otherwise every replica.
    let (serving, how) = match ha {
        HaMode::LeaderElection if wanted > 1 => (1, ": the leader serves, the others stand by"),
        HaMode::ActiveActive if wanted > 1 => (wanted, ", each serving"),
        _ => (wanted, ""),
    };
    // A rolling update counts the new pods with the old ones, so more than `wanted` may be
    // Ready for a moment: say so rather than hide it.
    let rolling = match status.updated_replicas.unwrap_or(wanted) {
        updated if updated < wanted => format!("; rolling: {updated} of {wanted} updated"),
        _ => String::new(),
    };
    let message = format!("{available} of {wanted} producer replicas Ready{how}{rolling}");
    if wanted == 0 && available == 0 {
        verdict(
            State::False,
            "ScaledToZero",
            "spec.producer.replicas is 0".into(),
        )
    } else if available >= serving {
        verdict(State::True, "Available", message)
    } else if available >= 1 {
        // Serving, with fewer replicas than asked for.
        verdict(State::True, "PartlyAvailable", message)
    } else {
        verdict(State::False, "Unavailable", message)
    }
}

fn condition(
    verdict: Verdict,
    generation: Option<i64>,
    previous: Option<&BurstPrefixPolicyStatus>,
    now: &Time,
) -> Condition {
    let status = match verdict.state {
        State::True => "True",
        State::False => "False",
        State::Unknown => "Unknown",
    };
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

/// Whether `status` says Ready=True.
pub fn is_ready(status: Option<&BurstPrefixPolicyStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
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
            config: Some(Ok(())),
            endpoints: Some(Ok(3)),
            applied: Some(Ok(())),
            deployment: Some(available_deployment(1)),
            producer_url: Some("http://rl-producer.ml.svc:8080".into()),
            ha: HaMode::LeaderElection,
        }
    }

    fn deployment(wanted: i32, available: i32, updated: i32) -> Deployment {
        serde_json::from_value(json!({
            "spec": {"replicas": wanted, "selector": {}, "template": {}},
            "status": {"availableReplicas": available, "updatedReplicas": updated},
        }))
        .unwrap()
    }

    fn producer_condition(ha: HaMode, deployment: Deployment) -> Condition {
        let observed = Observed {
            ha,
            deployment: Some(deployment),
            ..observed()
        };
        get(&status(&observed, None, time(1)), "ProducerAvailable").clone()
    }

    #[test]
    fn with_leader_election_one_ready_replica_is_the_goal() {
        let leader = producer_condition(HaMode::LeaderElection, deployment(3, 1, 3));
        assert_eq!(
            (leader.status.as_str(), leader.reason.as_str()),
            ("True", "Available")
        );
        assert_eq!(
            leader.message,
            "1 of 3 producer replicas Ready: the leader serves, the others stand by"
        );
        let none = producer_condition(HaMode::LeaderElection, deployment(3, 0, 3));
        assert_eq!(
            (none.status.as_str(), none.reason.as_str()),
            ("False", "Unavailable")
        );
    }

    #[test]
    fn active_active_counts_every_ready_replica_and_serves_while_one_is() {
        let all = producer_condition(HaMode::ActiveActive, deployment(3, 3, 3));
        assert_eq!(
            (all.status.as_str(), all.reason.as_str()),
            ("True", "Available")
        );
        assert_eq!(all.message, "3 of 3 producer replicas Ready, each serving");
        let some = producer_condition(HaMode::ActiveActive, deployment(3, 2, 3));
        assert_eq!(
            (some.status.as_str(), some.reason.as_str()),
            ("True", "PartlyAvailable")
        );
        assert_eq!(some.message, "2 of 3 producer replicas Ready, each serving");
        let none = producer_condition(HaMode::ActiveActive, deployment(3, 0, 0));
        assert_eq!(
            (none.status.as_str(), none.reason.as_str()),
            ("False", "Unavailable")
        );
        // A surge pod counts with the old ones while a rolling update runs.
        let rolling = producer_condition(HaMode::ActiveActive, deployment(3, 4, 1));
        assert_eq!(rolling.reason, "Available");
        assert_eq!(
            rolling.message,
            "4 of 3 producer replicas Ready, each serving; rolling: 1 of 3 updated"
        );
        // Ready follows: serving is Ready, however few serve.
        let observed = Observed {
            ha: HaMode::ActiveActive,
            deployment: Some(deployment(3, 1, 3)),
            ..observed()
        };
        assert!(is_ready(Some(&status(&observed, None, time(1)))));
    }

    fn get<'a>(status: &'a BurstPrefixPolicyStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn problem(reason: &'static str, message: &str) -> Problem {
        Problem {
            reason,
            message: message.into(),
        }
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
        assert!(is_ready(Some(&status)));
    }

    #[test]
    fn invalid_config_is_not_ready_and_later_stages_wait() {
        let observed = Observed {
            config: Some(Err(problem(
                "InvalidConfig",
                "maxPerReplica is 0, but must be -1 (unlimited) or >= 1",
            ))),
            endpoints: None,
            applied: None,
            deployment: None,
            ..observed()
        };
        let status = status(&observed, None, time(1));
        assert_eq!(get(&status, "Ready").status, "False");
        assert_eq!(get(&status, "Ready").reason, "InvalidConfig");
        assert!(get(&status, "ConfigValid")
            .message
            .contains("maxPerReplica is 0"));
        assert_eq!(get(&status, "EndpointsDiscovered").status, "Unknown");
        assert!(!is_ready(Some(&status)));
    }

    #[test]
    fn each_failure_has_its_reason_on_its_condition_and_on_ready() {
        let cases = [
            (
                Observed {
                    endpoints: Some(Err(problem("PoolAPIMissing", "install the CRDs"))),
                    applied: None,
                    ..observed()
                },
                "EndpointsDiscovered",
                "PoolAPIMissing",
            ),
            (
                Observed {
                    endpoints: Some(Err(problem("PoolNotFound", "InferencePool ml/p not found"))),
                    applied: None,
                    ..observed()
                },
                "EndpointsDiscovered",
                "PoolNotFound",
            ),
            (
                Observed {
                    applied: Some(Err(problem(
                        "ApplyFailed",
                        "Deployment ml/rl-producer: 422",
                    ))),
                    ..observed()
                },
                "ProducerAvailable",
                "ApplyFailed",
            ),
        ];
        for (observed, type_, reason) in cases {
            let status = status(&observed, None, time(1));
            assert_eq!(get(&status, type_).status, "False", "{reason}");
            assert_eq!(get(&status, type_).reason, reason);
            assert_eq!(get(&status, "Ready").reason, reason);
            assert!(get(&status, "Ready").message.starts_with(type_));
        }
    }

    #[test]
    fn ready_names_a_failure_before_what_it_waits_for() {
        let observed = Observed {
            endpoints: Some(Ok(0)),
            applied: Some(Err(problem(
                "ApplyFailed",
                "Deployment ml/rl-producer: 422",
            ))),
            ..observed()
        };
        let status = status(&observed, None, time(1));
        assert_eq!(get(&status, "EndpointsDiscovered").reason, "NoReadyPods");
        assert_eq!(get(&status, "Ready").reason, "ApplyFailed");
    }

    #[test]
    fn no_endpoints_and_unavailable_producer_are_reported() {
        let observed = Observed {
            endpoints: Some(Ok(0)),
            deployment: Some(available_deployment(0)),
            ..observed()
        };
        let status = status(&observed, None, time(1));
        assert_eq!(get(&status, "EndpointsDiscovered").reason, "NoReadyPods");
        assert_eq!(get(&status, "ProducerAvailable").reason, "Unavailable");
        assert_eq!(get(&status, "Ready").reason, "NoReadyPods");
    }

    #[test]
    fn a_failed_discovery_keeps_the_last_endpoint_count() {
        let first = status(&observed(), None, time(1));
        let failed = Observed {
            endpoints: Some(Err(problem("DiscoveryFailed", "500"))),
            applied: None,
            ..observed()
        };
        assert_eq!(status(&failed, Some(&first), time(2)).endpoints, 3);
    }

    #[test]
    fn unchanged_world_gives_identical_status() {
        let first = status(&observed(), None, time(1));
        let second = status(&observed(), Some(&first), time(9));
        assert_eq!(first, second);
        let changed = status(
            &Observed {
                endpoints: Some(Ok(0)),
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
