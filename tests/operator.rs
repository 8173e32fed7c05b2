//! The operator against a real kube-apiserver: policy → ConfigMap → real producer, pod churn,
//! CRD validation, restoration of hand-edited children, leader election, and the engines' KV
//! event port and tokenizer volume on the producer's children.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_test_support::ControlPlane;
use common::{
    condition, create_pod, create_policy, endpoint_ids, eventually, install_crd, producer_config,
    set_pod_status, start_operator, start_producer, vllm_policy, Scene, TIMEOUT,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

/// The whole path: a policy and three pods become the producer's ConfigMap; the real producer
/// reads it with its own ServiceAccount's RBAC and co-locates a burst on one pod; pod churn and
/// deleted or edited children are reconciled.
#[tokio::test(flavor = "multi_thread")]
async fn policy_pods_configmap_producer_and_churn() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("operator").await;
    let operator = start_operator(control_plane, &ns, &[]);

    create_policy(
        &client,
        &ns,
        "rl",
        // Balanced by requests: the burst below checks co-location through the operator's
        // config, a rule of that mode (the time cost may split a short prompt's samples).
        vllm_policy(json!({
            "windowDurationMs": 200,
            "balanceBy": "requests",
        })),
    )
    .await;
    for i in 0..3 {
        create_pod(&client, &ns, &format!("vllm-{i}"), "vllm").await;
        set_pod_status(
            &client,
            &ns,
            &format!("vllm-{i}"),
            &format!("10.1.0.{}", i + 1),
            true,
        )
        .await;
    }
    create_pod(&client, &ns, "web-0", "web").await;
    set_pod_status(&client, &ns, "web-0", "10.1.9.9", true).await;

    let expected: Vec<String> = (0..3).map(|i| format!("{ns}/vllm-{i}-rank-0")).collect();
    eventually("three endpoints in the ConfigMap", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| *ids == expected)
    })
    .await;
    let config = producer_config(&client, &ns, "rl-producer").await.unwrap();
    assert_eq!(config.planner.window_duration_ms, Some(200));
    assert_eq!(config.endpoints[0].address, "10.1.0.1:8000");

    // Status: discovered and valid; the producer is not available until its Deployment says so
    // (no kube-controller-manager runs here), so we set the Deployment status ourselves.
    eventually("EndpointsDiscovered=True", TIMEOUT, || async {
        condition(&client, &ns, "rl", "EndpointsDiscovered")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(
        condition(&client, &ns, "rl", "Ready").await.unwrap(),
        ("False".into(), "Unavailable".into())
    );
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    deployments
        .patch_status(
            "rl-producer",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"status": {"replicas": 1, "availableReplicas": 1, "readyReplicas": 1}}),
            ),
        )
        .await
        .unwrap();
    eventually("Ready=True", TIMEOUT, || async {
        condition(&client, &ns, "rl", "Ready")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    let policy = Api::<BurstPrefixPolicy>::namespaced(client.clone(), &ns)
        .get("rl")
        .await
        .unwrap();
    let status = policy.status.unwrap();
    assert_eq!(status.endpoints, 3);
    assert_eq!(status.observed_generation, policy.metadata.generation);
    assert_eq!(
        status.producer_url.as_deref(),
        Some(format!("http://rl-producer.{ns}.svc:8080").as_str())
    );

    // The real producer, out of cluster, with exactly the RBAC of the ServiceAccount the
    // operator created for it.
    let producer = start_producer(control_plane, &ns, "rl-producer").await;
    let (api, admin) = (producer.api.clone(), producer.admin.clone());
    let producer = producer.process;
    let http = reqwest::Client::new();
    eventually("the producer to be ready", TIMEOUT, || async {
        let response = http.get(format!("{admin}/readyz")).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;
    let produce_url = format!("{api}/v1/produce");
    let burst = (0..8).map(|_| {
        let (http, url) = (http.clone(), produce_url.clone());
        async move {
            http.post(url)
                .json(&json!({"model": "llama", "prompt": "Solve step by step: what is 17 * 23? ".repeat(40)}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    let answers = futures::future::join_all(burst).await;
    let assigned: BTreeSet<String> = answers
        .iter()
        .map(|a| {
            a["assignedEndpoint"]
                .as_str()
                .unwrap_or_else(|| {
                    panic!("no assignment: {a}; producer log:\n{}", producer.log_text())
                })
                .to_string()
        })
        .collect();
    assert_eq!(
        assigned.len(),
        1,
        "the burst co-locates on one endpoint: {answers:?}"
    );
    let endpoint = assigned.into_iter().next().unwrap();
    assert!(
        expected.contains(&endpoint),
        "{endpoint} is a real pod's endpoint"
    );
    for answer in &answers {
        for matched in answer["matches"].as_array().unwrap() {
            let full = matched["endpoint"] == endpoint.as_str();
            assert_eq!(
                matched["matchBlocks"] == matched["totalBlocks"],
                full,
                "{answer}"
            );
        }
    }

    // Pod churn reaches the ConfigMap: unready, deleted, IP change. Measured, not asserted.
    let mut latencies = Vec::new();
    let started = Instant::now();
    set_pod_status(&client, &ns, "vllm-1", "10.1.0.2", false).await;
    eventually("vllm-1 to leave", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 2 && !ids.iter().any(|id| id.contains("vllm-1")))
    })
    .await;
    latencies.push(("unready", started.elapsed()));
    let started = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("vllm-2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("vllm-2 to leave", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 1)
    })
    .await;
    latencies.push(("deleted", started.elapsed()));
    let started = Instant::now();
    set_pod_status(&client, &ns, "vllm-0", "10.1.0.42", true).await;
    eventually("vllm-0's new IP", TIMEOUT, || async {
        let config = producer_config(&client, &ns, "rl-producer").await?;
        (config.endpoints.first()?.address == "10.1.0.42:8000").then_some(())
    })
    .await;
    latencies.push(("ip change", started.elapsed()));
    let started = Instant::now();
    set_pod_status(&client, &ns, "vllm-1", "10.1.0.2", true).await;
    eventually("vllm-1 to return", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 2)
    })
    .await;
    latencies.push(("ready again", started.elapsed()));
    for (event, latency) in &latencies {
        println!(
            "churn-to-ConfigMap latency ({event}): {:.1} ms",
            latency.as_secs_f64() * 1e3
        );
    }

    // The producer follows the ConfigMap: its endpoint list now has the two pods.
    eventually("the producer to see two endpoints", TIMEOUT, || async {
        let endpoints: Value = http
            .get(format!("{api}/v1/endpoints"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let text = endpoints.to_string();
        (text.contains("vllm-0-rank-0")
            && text.contains("vllm-1-rank-0")
            && !text.contains("vllm-2-rank-0"))
        .then_some(())
    })
    .await;

    // A deleted or hand-edited child is restored.
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    config_maps
        .delete("rl-producer", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the ConfigMap to be restored", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 2)
    })
    .await;
    config_maps
        .patch(
            "rl-producer",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"config.yaml": "windowDurationMs: 9\n"}})),
        )
        .await
        .unwrap();
    eventually("the hand edit to be undone", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 2)
    })
    .await;
    drop(producer);
    drop(operator);
}

/// `kubectl apply` of an invalid policy is refused by the API server, naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn invalid_policies_are_refused_with_their_message() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("invalid").await.unwrap();
    let cases = [
        (
            "windowDurationMs: -1",
            "windowDurationMs must be 0 (zero-wait) or between 1 and 10000",
        ),
        (
            "maxPerReplica: 0",
            "maxPerReplica must be -1 (unlimited) or >= 1",
        ),
        ("maxBatchSize: -3", "maxBatchSize"),
        ("blockSizeTokens: 0", "blockSizeTokens"),
        (
            "maxPrefixTokensToMatch: 10",
            "maxPrefixTokensToMatch must be 0, or >= blockSizeTokens",
        ),
        ("minColocateBlocks: -1", "minColocateBlocks"),
        ("balanceBy: bytes", "balanceBy"),
        (
            "memory: {cacheTokensPerReplica: 32}",
            "memory.cacheTokensPerReplica must be >= blockSizeTokens",
        ),
        (
            "memory: {loadHalfLifeMs: -1}",
            "memory.loadHalfLifeMs must be between 0 and 3600000",
        ),
    ];
    for (i, (field, message)) in cases.iter().enumerate() {
        let yaml = format!(
            "apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: bad-{i}\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n  targetPorts: [{{number: 8000}}]\n  {field}\n"
        );
        let stderr = kubectl_apply(control_plane, &yaml).unwrap_err();
        assert!(stderr.contains(message), "{field}: {stderr}");
    }
    let both = format!("apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: both\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n  poolRef: {{name: pool}}\n  targetPorts: [{{number: 8000}}]\n");
    assert!(kubectl_apply(control_plane, &both)
        .unwrap_err()
        .contains("exactly one of selector and poolRef"));
    let no_ports = format!("apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: noports\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n");
    assert!(kubectl_apply(control_plane, &no_ports)
        .unwrap_err()
        .contains("targetPorts needs 1 to 8 ports"));
    let good = format!("apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: good\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n  targetPorts: [{{number: 8000}}]\n  maxPerReplica: 4\n");
    kubectl_apply(control_plane, &good).unwrap();

    // What the Deployment, the Service or the pod list would refuse later is refused now.
    let spec_cases = [
        (
            "selector: {matchLabels: {app: vllm}}\n  producer: {image: ''}",
            "producer.image must be an image reference without spaces",
        ),
        (
            "selector: {matchLabels: {app: vllm}}\n  producer: {image: 'a b'}",
            "producer.image must be an image reference without spaces",
        ),
        (
            "selector: {matchLabels: {app: vllm}}\n  producer: {port: 9090}",
            "producer.port, producer.metricsPort and producer.eppPort must be three different ports",
        ),
        (
            "selector: {matchLabels: {app: vllm}}\n  producer: {eppPort: 8080}",
            "must be three different ports",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: Foo, values: [vllm]}]}",
            "selector.matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: In}]}",
            "selector.matchExpressions[].values must not be empty for In and NotIn",
        ),
        (
            "selector: {matchExpressions: [{key: app, operator: Exists, values: [x]}]}",
            "selector.matchExpressions[].values must be empty for Exists and DoesNotExist",
        ),
    ];
    for (i, (spec, message)) in spec_cases.iter().enumerate() {
        let yaml = format!(
            "apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: refused-{i}\n  namespace: {ns}\nspec:\n  targetPorts: [{{number: 8000}}]\n  {spec}\n"
        );
        let stderr = kubectl_apply(control_plane, &yaml).unwrap_err();
        assert!(stderr.contains(message), "{spec}: {stderr}");
    }

    // One message per broken rule: the rule table's, not a second one from an OpenAPI bound.
    let yaml = format!("apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: once\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n  targetPorts: [{{number: 8000}}]\n  windowDurationMs: -1\n  maxBatchSize: 0\n");
    let stderr = kubectl_apply(control_plane, &yaml).unwrap_err();
    for rule in ["windowDurationMs", "maxBatchSize"] {
        assert_eq!(
            stderr.matches(rule).count(),
            2,
            "{rule} named by its field path and its one message: {stderr}"
        );
    }
    assert!(
        !stderr.contains("should be greater than or equal to"),
        "{stderr}"
    );
}

fn kubectl_apply(control_plane: &ControlPlane, yaml: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = control_plane
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Two operators with leader election: one leads; when it goes, the other takes over.
#[tokio::test(flavor = "multi_thread")]
async fn two_operators_one_leader() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("leader").await;
    let args = |identity: &'static str| {
        vec![
            "--leader-elect",
            "--lease-namespace",
            ns.as_str(),
            "--identity",
            identity,
            "--lease-duration-seconds",
            "4",
        ]
    };
    let mut first = Some(start_operator(control_plane, &ns, &args("op-a")));
    let mut second = Some(start_operator(control_plane, &ns, &args("op-b")));
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let holder = eventually("a lease holder", TIMEOUT, || async {
        leases
            .get_opt("burst-prefix-operator")
            .await
            .ok()??
            .spec?
            .holder_identity
    })
    .await;
    // Only the holder reconciles: a policy gets its ConfigMap, and only the leader says so.
    create_policy(&client, &ns, "rl", vllm_policy(json!({}))).await;
    eventually("the leader to reconcile", TIMEOUT, || async {
        producer_config(&client, &ns, "rl-producer").await
    })
    .await;
    let (leader, follower, follower_id) = if holder == "op-a" {
        (&mut first, &mut second, "op-b")
    } else {
        (&mut second, &mut first, "op-a")
    };
    assert!(leader
        .as_ref()
        .unwrap()
        .log_text()
        .contains("acquired the leader lease"));
    assert!(!follower
        .as_ref()
        .unwrap()
        .log_text()
        .contains("acquired the leader lease"));
    // The leader goes away; the follower takes the lease once it expires.
    drop(leader.take());
    eventually("the follower to take the lease", TIMEOUT, || async {
        let holder = leases
            .get_opt("burst-prefix-operator")
            .await
            .ok()??
            .spec?
            .holder_identity?;
        (holder == follower_id).then_some(())
    })
    .await;
    let follower = follower.as_ref().unwrap();
    eventually("the follower to lead", TIMEOUT, || async {
        follower
            .log_text()
            .contains("acquired the leader lease")
            .then_some(())
    })
    .await;
}

/// Producers run the operator's image unless a policy pins its own, so restarting the operator
/// with a new --producer-image (a chart upgrade) rolls them; with more than one replica they get
/// a Lease (theirs to hold, with get and patch only), a PodDisruptionBudget, Recreate and a
/// spread; with `ha: activeActive` the Lease goes and the update rolls; at one replica the rest
/// goes.
#[tokio::test(flavor = "multi_thread")]
async fn producers_follow_the_operator_image_and_their_replicas() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("producers").await;
    let image_args = |image: &'static str| {
        vec![
            "--producer-image",
            image,
            "--producer-image-pull-secret",
            "regcred",
        ]
    };
    let operator = start_operator(control_plane, &ns, &image_args("example.com/producer:v2"));
    let spec = vllm_policy(json!({}));
    create_policy(&client, &ns, "rl", spec.clone()).await;
    let mut pinned = spec.clone();
    pinned["producer"] = json!({"image": "example.com/producer:pinned"});
    create_policy(&client, &ns, "pinned", pinned).await;

    // Stored without an image: the CRD writes no default.
    let stored = Api::<BurstPrefixPolicy>::namespaced(client.clone(), &ns)
        .get("rl")
        .await
        .unwrap();
    assert_eq!(stored.spec.producer.image, None);
    assert_eq!(stored.spec.producer.epp_port, 9002);

    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let image_of = |name: &'static str| {
        let deployments = deployments.clone();
        async move {
            let deployment = deployments.get_opt(name).await.ok()??;
            let pod = deployment.spec.template.spec?;
            pod.containers[0].image.clone()
        }
    };
    eventually("the operator's image", TIMEOUT, || async {
        image_of("rl-producer")
            .await
            .filter(|i| i == "example.com/producer:v2")
    })
    .await;
    eventually("the pinned image", TIMEOUT, || async {
        image_of("pinned-producer")
            .await
            .filter(|i| i == "example.com/producer:pinned")
    })
    .await;
    let deployment = deployments.get("rl-producer").await.unwrap();
    let pod = deployment.spec.template.spec.unwrap();
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
    let args = pod.containers[0].args.clone().unwrap().join(" ");
    assert!(args.contains("--epp-listen 0.0.0.0:9002"), "{args}");
    assert!(!args.contains("--leader-elect"), "{args}");
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .get("rl-producer")
        .await
        .unwrap();
    let ports: Vec<(String, i32, Option<String>)> = service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port, p.app_protocol))
        .collect();
    assert_eq!(
        ports,
        [
            ("http".into(), 8080, Some("http".into())),
            // TLS by default (self-signed): HTTP/2 over TLS, GAIE's endpoint-picker convention.
            ("epp".into(), 9002, Some("http2".into())),
            ("metrics".into(), 9090, Some("http".into())),
        ]
    );

    // Three replicas: leader election, a Lease the producers hold, a budget, Recreate, spread.
    let policies = Api::<BurstPrefixPolicy>::namespaced(client.clone(), &ns);
    let replicas = |n: i32| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "rl",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"producer": {"replicas": n}}})),
                )
                .await
                .unwrap();
        }
    };
    replicas(3).await;
    let deployment = eventually("three replicas, Recreate", TIMEOUT, || async {
        deployments.get("rl-producer").await.ok().filter(|d| {
            d.spec.replicas == Some(3)
                && d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate")
        })
    })
    .await;
    assert!(deployment.spec.strategy.unwrap().rolling_update.is_none());
    let pod = deployment.spec.template.spec.unwrap();
    assert_eq!(
        pod.topology_spread_constraints.unwrap()[0].topology_key,
        "kubernetes.io/hostname"
    );
    let args = pod.containers[0].args.clone().unwrap().join(" ");
    assert!(
        args.ends_with(&format!(
            "--leader-elect --lease-name rl-producer --lease-namespace {ns}"
        )),
        "{args}"
    );
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns);
    eventually("the Lease and the budget", TIMEOUT, || async {
        let lease = leases.get_opt("rl-producer").await.ok()??;
        let budget = budgets.get_opt("rl-producer").await.ok()??;
        Some((lease, budget))
    })
    .await;
    let role = Api::<Role>::namespaced(client.clone(), &ns)
        .get("rl-producer")
        .await
        .unwrap();
    assert_eq!(role.rules.unwrap().len(), 2);
    // As the producer's ServiceAccount: its Lease, get and patch; nothing else of Leases.
    let producer = control_plane.client_for(
        &control_plane
            .service_account_token(&ns, "rl-producer")
            .await
            .unwrap(),
    );
    for (verb, name, allowed) in [
        ("get", Some("rl-producer"), true),
        ("patch", Some("rl-producer"), true),
        ("update", Some("rl-producer"), false),
        ("delete", Some("rl-producer"), false),
        ("get", Some("pinned-producer"), false),
        ("create", None, false),
        ("list", None, false),
    ] {
        assert_eq!(
            may(&producer, verb, "coordination.k8s.io", "leases", &ns, name).await,
            allowed,
            "{verb} {name:?}"
        );
    }

    // Active-active: every replica serves. The Lease goes (pruned like any child no longer
    // desired) and so does the producers' right to hold it; the budget and the spread stay;
    // the update rolls one new pod at a time, none unavailable.
    policies
        .patch(
            "rl",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"producer": {"ha": "activeActive"}}})),
        )
        .await
        .unwrap();
    let deployment = eventually("three replicas, RollingUpdate", TIMEOUT, || async {
        deployments.get("rl-producer").await.ok().filter(|d| {
            d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("RollingUpdate")
        })
    })
    .await;
    assert_eq!(deployment.spec.replicas, Some(3));
    let rolling = deployment.spec.strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        (rolling.max_surge, rolling.max_unavailable),
        (Some(IntOrString::Int(1)), Some(IntOrString::Int(0)))
    );
    let pod = deployment.spec.template.spec.unwrap();
    assert!(pod.topology_spread_constraints.is_some());
    let args = pod.containers[0].args.clone().unwrap().join(" ");
    assert!(!args.contains("--leader-elect"), "{args}");
    eventually("the Lease to go", TIMEOUT, || async {
        leases
            .get_opt("rl-producer")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(budgets.get_opt("rl-producer").await.unwrap().is_some());
    let role = Api::<Role>::namespaced(client.clone(), &ns)
        .get("rl-producer")
        .await
        .unwrap();
    assert_eq!(role.rules.unwrap().len(), 1);
    assert!(
        !may(
            &producer,
            "get",
            "coordination.k8s.io",
            "leases",
            &ns,
            Some("rl-producer")
        )
        .await
    );

    // Back to one: the budget and the Lease go, RollingUpdate is back.
    replicas(1).await;
    eventually("the budget and the Lease to go", TIMEOUT, || async {
        (budgets.get_opt("rl-producer").await.ok()?.is_none()
            && leases.get_opt("rl-producer").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    let deployment = deployments.get("rl-producer").await.unwrap();
    let strategy = deployment.spec.strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));

    // A new operator image setting (what `helm upgrade` does to the operator's flags) rolls the
    // producer that follows it, and leaves the pinned one alone.
    drop(operator);
    let _operator = start_operator(control_plane, &ns, &image_args("example.com/producer:v3"));
    eventually("the new image", TIMEOUT, || async {
        image_of("rl-producer")
            .await
            .filter(|i| i == "example.com/producer:v3")
    })
    .await;
    assert_eq!(
        image_of("pinned-producer").await.as_deref(),
        Some("example.com/producer:pinned")
    );
}

/// `engines.kvEvents.bind` opens the producer's container port, a Service port and (with the
/// operator's NetworkPolicy) an ingress rule from the policy's inference pods; the connect
/// topology opens nothing. `spec.producer.tokenizer` mounts each kind of volume read-only,
/// which the API server accepts in the Deployment, and the rendered config names the
/// directory. Each step is what the operator applied (the API server took the Deployment,
/// Service and NetworkPolicy as built), read back from the API server.
#[tokio::test(flavor = "multi_thread")]
async fn kv_event_port_and_tokenizer_volume_reach_the_producer_children() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("kv-events").await;
    let _operator = start_operator(
        control_plane,
        &ns,
        &[
            "--producer-network-policy",
            r#"{"api": [{"podSelector": {}}]}"#,
        ],
    );
    create_policy(
        &client,
        &ns,
        "rl",
        vllm_policy(json!({
            "engines": {"kvEvents": {"bind": "tcp://0.0.0.0:5557", "replayPort": 5558}},
            "producer": {"tokenizer": {"configMap": "qwen-tokenizer"}},
        })),
    )
    .await;
    create_pod(&client, &ns, "vllm-0", "vllm").await;
    set_pod_status(&client, &ns, "vllm-0", "10.1.0.1", true).await;

    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let network_policies = Api::<NetworkPolicy>::namespaced(client.clone(), &ns);
    let service_ports = || async {
        let service = services.get_opt("rl-producer").await.ok()??;
        Some(
            service
                .spec?
                .ports?
                .into_iter()
                .map(|p| {
                    (
                        p.name.unwrap_or_default(),
                        p.port,
                        serde_json::to_value(p.target_port).unwrap(),
                        p.app_protocol.unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    let pod_spec = || async {
        deployments
            .get_opt("rl-producer")
            .await
            .ok()??
            .spec
            .template
            .spec
    };
    let ingress = || async {
        let rules = network_policies
            .get_opt("rl-producer")
            .await
            .ok()??
            .spec?
            .ingress?;
        Some(serde_json::to_value(rules).unwrap())
    };
    let tokenizer_path = || async {
        let config = producer_config(&client, &ns, "rl-producer").await?;
        config.planner.engines.tokenizer.map(|t| t.path)
    };

    let ports = eventually("the Service's kv-events port", TIMEOUT, || async {
        service_ports().await.filter(|ports| ports.len() == 4)
    })
    .await;
    assert_eq!(
        ports[3],
        (
            "kv-events".to_string(),
            5557,
            json!("kv-events"),
            "tcp".to_string()
        )
    );
    let pod = eventually("the producer Deployment", TIMEOUT, pod_spec).await;
    let container = &pod.containers[0];
    let container_ports: Vec<_> = container
        .ports
        .clone()
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.container_port))
        .collect();
    assert_eq!(container_ports[3], ("kv-events".to_string(), 5557));
    let volume = &pod.volumes.as_ref().unwrap()[0];
    assert_eq!(volume.name, "tokenizer");
    assert_eq!(volume.config_map.as_ref().unwrap().name, "qwen-tokenizer");
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/burst-prefix/tokenizer", Some(true))
    );
    let config = producer_config(&client, &ns, "rl-producer").await.unwrap();
    let events = config.planner.engines.kv_events.clone().unwrap();
    assert_eq!(
        (events.bind.as_deref(), events.replay_port),
        (Some("tcp://0.0.0.0:5557"), 5558)
    );
    assert_eq!(
        config.planner.engines.tokenizer.unwrap().path,
        "/etc/burst-prefix/tokenizer"
    );
    let rules = eventually("the NetworkPolicy", TIMEOUT, ingress).await;
    assert_eq!(
        rules,
        json!([
            {"ports": [{"port": 8080, "protocol": "TCP"}], "from": [{"podSelector": {}}]},
            {"ports": [{"port": 5557, "protocol": "TCP"}],
             "from": [{"podSelector": {"matchLabels": {"app": "vllm"}}}]},
        ]),
        "the event port open to the policy's inference pods (app=vllm) only"
    );

    // The other two volumes, each taken by the API server in the Deployment.
    let policies = Api::<BurstPrefixPolicy>::namespaced(client.clone(), &ns);
    let patch = |spec: Value| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "rl",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": spec})),
                )
                .await
                .unwrap();
        }
    };
    patch(json!({"producer": {"tokenizer": {
        "configMap": null,
        "persistentVolumeClaim": "models",
        "subPath": "Qwen3-8B",
    }}}))
    .await;
    let pod = eventually("the claim mounted", TIMEOUT, || async {
        pod_spec().await.filter(|pod| {
            pod.volumes.as_ref().is_some_and(|v| {
                v[0].persistent_volume_claim.is_some() && v[0].config_map.is_none()
            })
        })
    })
    .await;
    let claim = pod.volumes.unwrap()[0]
        .persistent_volume_claim
        .clone()
        .unwrap();
    assert_eq!(
        (claim.claim_name.as_str(), claim.read_only),
        ("models", Some(true))
    );
    assert_eq!(
        pod.security_context
            .unwrap()
            .fs_group_change_policy
            .as_deref(),
        Some("OnRootMismatch")
    );
    eventually(
        "the config to name the claim's subPath",
        TIMEOUT,
        || async {
            tokenizer_path()
                .await
                .filter(|p| p == "/etc/burst-prefix/tokenizer/Qwen3-8B")
        },
    )
    .await;
    patch(json!({"producer": {"tokenizer": {
        "persistentVolumeClaim": null,
        "subPath": null,
        "image": "registry.example/models/qwen3-tokenizer:1",
    }}}))
    .await;
    let pod = eventually("the image mounted", TIMEOUT, || async {
        pod_spec()
            .await
            .filter(|pod| pod.volumes.as_ref().is_some_and(|v| v[0].image.is_some()))
    })
    .await;
    assert_eq!(
        pod.volumes.unwrap()[0]
            .image
            .clone()
            .unwrap()
            .reference
            .as_deref(),
        Some("registry.example/models/qwen3-tokenizer:1")
    );
    assert_eq!(pod.security_context.unwrap().fs_group_change_policy, None);
    eventually("the config to name the image's root", TIMEOUT, || async {
        tokenizer_path()
            .await
            .filter(|p| p == "/etc/burst-prefix/tokenizer")
    })
    .await;

    // The connect topology: the producers connect out, so the port and the rule go; without a
    // tokenizer the volume goes and the config names none.
    patch(json!({
        "engines": {"kvEvents": {"bind": null, "connectPort": 5557}},
        "producer": {"tokenizer": null},
    }))
    .await;
    eventually("the Service without kv-events", TIMEOUT, || async {
        service_ports().await.filter(|ports| ports.len() == 3)
    })
    .await;
    let pod = eventually(
        "the Deployment without port and volume",
        TIMEOUT,
        || async {
            pod_spec().await.filter(|pod| {
                pod.volumes.is_none() && pod.containers[0].ports.as_ref().map(Vec::len) == Some(3)
            })
        },
    )
    .await;
    assert!(pod.containers[0].volume_mounts.is_none());
    eventually(
        "the NetworkPolicy without the event rule",
        TIMEOUT,
        || async {
            ingress()
                .await
                .filter(|rules| rules.as_array().is_some_and(|r| r.len() == 1))
        },
    )
    .await;
    let config = producer_config(&client, &ns, "rl-producer").await.unwrap();
    assert_eq!(config.planner.engines.tokenizer, None);
    assert_eq!(config.planner.engines.kv_events.unwrap().connect_port, 5557);

    // What CEL cannot see: the producer's own ConfigMap as the tokenizer's.
    create_policy(
        &client,
        &ns,
        "own",
        vllm_policy(json!({"producer": {"tokenizer": {"configMap": "own-producer"}}})),
    )
    .await;
    let (_, reason, message) = eventually("InvalidConfig", TIMEOUT, || async {
        common::condition_full(&client, &ns, "own", "ConfigValid")
            .await
            .filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "InvalidConfig");
    assert!(
        message.contains("\"own-producer\" is the producer's own ConfigMap"),
        "{message}"
    );
}

/// The CRD refuses a bind that is not `tcp://HOST:PORT` on every interface, a bind port the
/// producer already uses, and a tokenizer without exactly one volume or leaving it, each with
/// the message of the rule (the operator's validation gives the same for what an older CRD
/// let through); it takes the documented forms.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_binds_and_tokenizers_are_refused_by_the_crd() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("kv-refused").await.unwrap();
    let apply = |i: usize, spec: &str| {
        kubectl_apply(
            control_plane,
            &format!(
                "apiVersion: burstprefix.io/v1alpha1\nkind: BurstPrefixPolicy\nmetadata:\n  name: p-{i}\n  namespace: {ns}\nspec:\n  selector: {{matchLabels: {{app: vllm}}}}\n  targetPorts: [{{number: 8000}}]\n  {spec}\n"
            ),
        )
    };
    let bind_message =
        "spec.engines.kvEvents.bind: Invalid value: engines.kvEvents.bind must be tcp://HOST:PORT";
    let cases = [
        ("engines: {kvEvents: {bind: '0.0.0.0:5557'}}", bind_message),
        ("engines: {kvEvents: {bind: 'tcp://*:5557'}}", bind_message),
        ("engines: {kvEvents: {bind: 'tcp://127.0.0.1:5557'}}", bind_message),
        ("engines: {kvEvents: {bind: 'tcp://0.0.0.0:65536'}}", bind_message),
        ("engines: {kvEvents: {bind: 'tcp://0.0.0.0:0'}}", bind_message),
        ("engines: {kvEvents: {bind: 'tcp://0.0.0.0'}}", bind_message),
        (
            "engines: {kvEvents: {bind: 'tcp://0.0.0.0:9090'}}",
            "the port of engines.kvEvents.bind must differ from producer.port, producer.metricsPort and producer.eppPort",
        ),
        (
            "engines: {kvEvents: {bind: 'tcp://[::]:7000'}}\n  producer: {eppPort: 7000}",
            "the port of engines.kvEvents.bind must differ",
        ),
        (
            "engines: {kvEvents: {bind: 'tcp://0.0.0.0:5557', connectPort: 5557}}",
            "engines.kvEvents.connectPort must be 0 (off) or a port, 1 to 65535, and 0 when kvEvents.bind is set",
        ),
        (
            "producer: {tokenizer: {}}",
            "producer.tokenizer needs exactly one of configMap, persistentVolumeClaim and image",
        ),
        (
            "producer: {tokenizer: {configMap: a, image: 'b:1'}}",
            "producer.tokenizer needs exactly one of",
        ),
        (
            "producer: {tokenizer: {persistentVolumeClaim: models, subPath: ../secrets}}",
            "producer.tokenizer.subPath must be a relative path inside the volume",
        ),
        (
            "producer: {tokenizer: {image: 'm:1', subPath: /etc}}",
            "producer.tokenizer.subPath must be a relative path",
        ),
        (
            "producer: {tokenizer: {configMap: Not_A_Name}}",
            "spec.producer.tokenizer.configMap",
        ),
    ];
    for (i, (spec, message)) in cases.iter().enumerate() {
        let stderr = apply(i, spec).expect_err(spec);
        assert!(stderr.contains(message), "{spec}: {stderr}");
    }
    for (i, spec) in [
        "engines: {kvEvents: {bind: 'tcp://0.0.0.0:5557', replayPort: 5558}}",
        "engines: {kvEvents: {bind: 'tcp://[::]:1'}}",
        "engines: {kvEvents: {bind: 'tcp://:::65535'}}",
        "engines: {kvEvents: {connectPort: 5557, replayPort: 5558}}",
        "producer: {tokenizer: {configMap: qwen-tokenizer}}",
        "producer: {tokenizer: {persistentVolumeClaim: models, subPath: hub/Qwen3-8B}}",
        "producer: {tokenizer: {image: 'registry.example/models/qwen3-tokenizer:1'}}",
    ]
    .iter()
    .enumerate()
    {
        apply(100 + i, spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
}

/// Asks the API server whether the holder of `client`'s token may do this.
async fn may(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
    name: Option<&str>,
) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: Some(namespace.into()),
                name: name.map(Into::into),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}
