//! Every way a reconcile fails, on the real API server: the condition and its reason, the
//! Event, no leftover children, and a retry backoff that grows. Also readiness when the API
//! server refuses the operator. A test binary of its own: one test changes the CRD's schema.

mod common;

use std::time::Duration;

use common::{
    children_of, condition_full, create_policy, eventually, http_get, policy_events,
    producer_config, start_operator, start_operator_as, vllm_policy, Process, Scene, TIMEOUT,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Waits for condition `type_` of `policy` to have `reason`; returns its message.
async fn reason(
    client: &Client,
    ns: &str,
    policy: &str,
    type_: &str,
    reason: &str,
    operator: &Process,
) -> String {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some((status, found, message)) = condition_full(client, ns, policy, type_).await {
            if found == reason {
                assert_eq!(status, "False", "{type_} {reason}: {message}");
                return message;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {type_} reason {reason} on {ns}/{policy}; now {:?}; operator log:\n{}",
            condition_full(client, ns, policy, type_).await,
            operator.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for a Warning Event with `reason` about `policy`; returns its note.
async fn warning_event(client: &Client, ns: &str, policy: &str, reason: &str) -> String {
    eventually(
        &format!("a {reason} Event for {policy}"),
        TIMEOUT,
        || async {
            policy_events(client, ns, policy)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .map(|e| {
                    assert_eq!(e.type_.as_deref(), Some("Warning"));
                    assert_eq!(
                        e.reporting_controller.as_deref(),
                        Some("burst-prefix-operator")
                    );
                    e.note.unwrap_or_default()
                })
        },
    )
    .await
}

/// The times of the attempts an Event series records, until there are `attempts` of them: the
/// first Event's time, then each `series.lastObservedTime` (the operator publishes the Event
/// once per failed attempt; kube-runtime's Recorder folds repeats into a series).
async fn attempt_times(
    client: &Client,
    ns: &str,
    policy: &str,
    reason: &str,
    attempts: usize,
) -> Vec<f64> {
    let mut times: Vec<f64> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while times.len() < attempts {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} attempts seen: {times:?}",
            times.len()
        );
        if let Some(event) = policy_events(client, ns, policy)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
        {
            let seconds = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime| {
                t.0.as_millisecond() as f64 / 1e3
            };
            if times.is_empty() {
                times.push(seconds(event.event_time.as_ref().unwrap()));
            }
            if let Some(series) = &event.series {
                let last = seconds(&series.last_observed_time);
                // One poll may miss an attempt; the count says how many there were.
                if times.last() != Some(&last) && series.count as usize == times.len() + 1 {
                    times.push(last);
                } else if series.count as usize > times.len() + 1 {
                    panic!(
                        "attempts were missed between polls (count {} after {} seen): poll faster",
                        series.count,
                        times.len()
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    times
}

/// The API server refuses the Deployment (requests above limits): ApplyFailed on Ready and
/// ProducerAvailable, a Warning Event naming the object and the API server's reason, nothing of
/// the policy applied (the dry run of every child goes first), and retries 1 s, 2 s, 4 s, 8 s
/// apart. Once fixed, the children appear.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_apply_is_reported_leaves_nothing_behind_and_backs_off() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("apply-failed").await;
    let operator = start_operator(control_plane, &ns, &[]);
    create_policy(
        &client,
        &ns,
        "rl",
        vllm_policy(json!({
            "producer": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
        })),
    )
    .await;
    // Polled from the start, so that no attempt is missed.
    let times = attempt_times(&client, &ns, "rl", "ApplyFailed", 5).await;
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    println!("retry gaps of a failing policy: {gaps:.2?} s");
    // 1, 2, 4, 8 s: each gap longer than the one before, the last several times the first.
    assert!(gaps.windows(2).all(|w| w[1] > w[0]), "{gaps:?}");
    assert!(gaps[3] > 3.0 * gaps[0], "{gaps:?}");

    let message = reason(&client, &ns, "rl", "Ready", "ApplyFailed", &operator).await;
    assert!(
        message.starts_with("ProducerAvailable: Deployment"),
        "{message}"
    );
    let message = reason(
        &client,
        &ns,
        "rl",
        "ProducerAvailable",
        "ApplyFailed",
        &operator,
    )
    .await;
    assert!(
        message.contains(&format!("Deployment {ns}/rl-producer")),
        "{message}"
    );
    assert!(
        message.contains("must be less than or equal to memory limit"),
        "{message}"
    );
    // The config itself is fine, and so is discovery (no pods: 0 endpoints).
    let (status, _, _) = condition_full(&client, &ns, "rl", "ConfigValid")
        .await
        .unwrap();
    assert_eq!(status, "True");
    let note = warning_event(&client, &ns, "rl", "ApplyFailed").await;
    assert!(
        note.contains("must be less than or equal to memory limit"),
        "{note}"
    );
    // Nothing was applied, by any attempt.
    assert_eq!(children_of(&client, &ns, "rl").await, Vec::<String>::new());

    // Fixed: everything is applied at once.
    Api::<burst_prefix_api::policy::BurstPrefixPolicy>::namespaced(client.clone(), &ns)
        .patch(
            "rl",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"producer": {"resources": null}}})),
        )
        .await
        .unwrap();
    eventually("the children once the policy is fixed", TIMEOUT, || async {
        (children_of(&client, &ns, "rl").await.len() == 6).then_some(())
    })
    .await;
    reason(
        &client,
        &ns,
        "rl",
        "ProducerAvailable",
        "Unavailable",
        &operator,
    )
    .await;
}

/// A policy whose own image the operator does not allow is InvalidConfig, with an Event, and
/// gets no children.
#[tokio::test(flavor = "multi_thread")]
async fn a_disallowed_image_is_invalid_config() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("image-policy").await;
    let operator = start_operator(
        control_plane,
        &ns,
        &["--allowed-producer-image-prefix", "ghcr.io/burst-prefix/"],
    );
    create_policy(
        &client,
        &ns,
        "pinned",
        vllm_policy(json!({
            "producer": {"image": "docker.io/someone/producer:1"},
        })),
    )
    .await;
    let message = reason(
        &client,
        &ns,
        "pinned",
        "ConfigValid",
        "InvalidConfig",
        &operator,
    )
    .await;
    assert!(
        message.contains("docker.io/someone/producer:1"),
        "{message}"
    );
    assert!(
        message.contains("--allowed-producer-image-prefix"),
        "{message}"
    );
    reason(&client, &ns, "pinned", "Ready", "InvalidConfig", &operator).await;
    let note = warning_event(&client, &ns, "pinned", "InvalidConfig").await;
    assert!(note.contains("is not allowed by this operator"), "{note}");
    assert_eq!(
        children_of(&client, &ns, "pinned").await,
        Vec::<String>::new()
    );
    // The status says what the other stages wait for.
    let (status, why, _) = condition_full(&client, &ns, "pinned", "EndpointsDiscovered")
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("Unknown", "WaitingForValidConfig")
    );
}

/// A CRD newer than the operator (here: `balanceBy` without its enum) stores a spec the
/// operator cannot deserialize. That policy becomes InvalidConfig, with serde's message and an
/// Event; the watch keeps working for every other policy.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_spec_is_invalid_config_and_does_not_break_the_watch() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("unreadable").await;
    let patch = json!([{
        "op": "remove",
        "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/balanceBy/enum",
    }]);
    let output = control_plane
        .kubectl()
        .args([
            "patch",
            "crd",
            "burstprefixpolicies.burstprefix.io",
            "--type=json",
            "-p",
            &patch.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The schema change reaches the API server's validation shortly after.
    eventually("the loosened schema to accept balanceBy: fromTheFuture", TIMEOUT, || async {
        let policy: burst_prefix_api::policy::BurstPrefixPolicy =
            serde_json::from_value(json!({
                "apiVersion": "burstprefix.io/v1alpha1",
                "kind": "BurstPrefixPolicy",
                "metadata": {"name": "future"},
                "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]},
            }))
            .unwrap();
        let mut raw = serde_json::to_value(&policy).unwrap();
        raw["spec"]["balanceBy"] = json!("fromTheFuture");
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &kube::api::ApiResource::erase::<burst_prefix_api::policy::BurstPrefixPolicy>(&()),
        );
        let object: kube::api::DynamicObject = serde_json::from_value(raw).unwrap();
        api.create(&PostParams::default(), &object).await.ok().map(|_| ())
    })
    .await;
    let operator = start_operator(control_plane, &ns, &[]);
    create_policy(&client, &ns, "good", vllm_policy(json!({}))).await;
    let message = reason(
        &client,
        &ns,
        "future",
        "ConfigValid",
        "InvalidConfig",
        &operator,
    )
    .await;
    assert!(
        message.contains("cannot be read by this operator"),
        "{message}"
    );
    assert!(message.contains("fromTheFuture"), "{message}");
    reason(&client, &ns, "future", "Ready", "InvalidConfig", &operator).await;
    let note = warning_event(&client, &ns, "future", "InvalidConfig").await;
    assert!(note.contains("fromTheFuture"), "{note}");
    assert_eq!(
        children_of(&client, &ns, "future").await,
        Vec::<String>::new()
    );
    // The other policy is reconciled as usual.
    eventually("the good policy's ConfigMap", TIMEOUT, || async {
        producer_config(&client, &ns, "good-producer").await
    })
    .await;
}

/// Readiness fails once the API server has refused the operator for longer than the grace
/// period, first with 403 (its RoleBinding deleted), then with 401 (its ServiceAccount deleted),
/// and recovers when access is back.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_while_the_api_server_refuses_the_operator() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("refused").await;
    let token = control_plane
        .service_account_token(&ns, "operator")
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}],
    }))
    .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), &ns);
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let kubeconfig = control_plane.kubeconfig_for("operator", &token).unwrap();
    let operator = start_operator_as(
        control_plane,
        &kubeconfig,
        &ns,
        &["--api-refusal-grace-seconds", "2"],
    );
    let readyz = format!("{}/readyz", operator.admin);
    eventually("the operator to be ready", TIMEOUT, || async {
        http_get(&readyz).await.filter(|(code, _)| *code == 200)
    })
    .await;
    let spec = vllm_policy(json!({}));
    create_policy(&client, &ns, "first", spec.clone()).await;
    eventually("the first policy's ConfigMap", TIMEOUT, || async {
        producer_config(&client, &ns, "first-producer").await
    })
    .await;

    // 403: the binding goes. Open watches keep streaming (authorization happens when a request
    // starts), so a new policy's reconcile is what meets the refusal.
    bindings
        .delete("operator", &DeleteParams::default())
        .await
        .unwrap();
    create_policy(&client, &ns, "second", spec.clone()).await;
    let (_, body) = eventually("/readyz to fail with 403", TIMEOUT, || async {
        http_get(&readyz).await.filter(|(code, _)| *code == 503)
    })
    .await;
    assert!(body.contains("(403)"), "{body}");
    assert_eq!(
        http_get(&format!("{}/healthz", operator.admin))
            .await
            .unwrap()
            .0,
        200
    );
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // The last answer is kept so a time-out says which refusal /readyz still reports.
    let last = std::sync::Mutex::new(None);
    let recovered = tokio::time::timeout(TIMEOUT, async {
        loop {
            let answer = http_get(&readyz).await;
            if answer.as_ref().is_some_and(|(code, _)| *code == 200) {
                return;
            }
            *last.lock().unwrap() = answer;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        recovered.is_ok(),
        "/readyz did not recover within {TIMEOUT:?} of the RoleBinding's return: {:?}",
        last.lock().unwrap()
    );
    eventually("the second policy's ConfigMap", TIMEOUT, || async {
        producer_config(&client, &ns, "second-producer").await
    })
    .await;

    // 401: the ServiceAccount goes, and with it every token it had.
    // The API server caches a successful authentication for a few seconds, so new policies
    // keep coming (one every 2 s, at most 30) until one meets the refusal.
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .delete("operator", &DeleteParams::default())
        .await
        .unwrap();
    let mut body = None;
    for i in 0..30 {
        create_policy(&client, &ns, &format!("later-{i}"), spec.clone()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some((503, text)) = http_get(&readyz).await {
            if text.contains("(401)") {
                body = Some(text);
                break;
            }
        }
    }
    let body = body.unwrap_or_else(|| {
        panic!(
            "/readyz never failed with 401; operator log:\n{}",
            operator.process.log_text()
        )
    });
    println!("readyz while refused: {}", body.trim());
    drop(operator);
}
