//! InferencePool policies on the real API server: the API missing (PoolAPIMissing), noticed when
//! it appears (the real v1 CRD of the Gateway API Inference Extension), the pool missing
//! (PoolNotFound), then discovered, its selector also admitting the pool's pods to the producer's
//! KV-event port; then the example whose pool names the producer as its endpoint picker. A test binary of its own: it installs a cluster-wide CRD the other tests
//! must not see.

mod common;

use burst_prefix_test_support::ControlPlane;
use common::{
    children_of, condition_full, create_pod, create_policy, eventually, policy_events,
    producer_config, repo, set_pod_status, start_operator, Scene, TIMEOUT,
};
use serde_json::json;

fn kubectl(control_plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = control_plane
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_api_is_reported_missing_then_noticed_then_used() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("pool").await;
    // A NetworkPolicy with every configured port closed: only the KV-event rule is left.
    let operator = start_operator(
        control_plane,
        &ns,
        &[
            "--pool-api-recheck-seconds",
            "1",
            "--producer-network-policy",
            "{}",
        ],
    );
    create_policy(
        &client,
        &ns,
        "llama",
        json!({
            "poolRef": {"name": "llama-pool"},
            "engines": {"kvEvents": {"bind": "tcp://0.0.0.0:5557"}},
        }),
    )
    .await;

    let why = |reason: &'static str| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            eventually(
                &format!("EndpointsDiscovered reason {reason}"),
                TIMEOUT,
                || async {
                    condition_full(&client, &ns, "llama", "EndpointsDiscovered")
                        .await
                        .filter(|c| c.1 == reason)
                },
            )
            .await
        }
    };
    let (status, _, message) = why("PoolAPIMissing").await;
    assert_eq!(status, "False");
    assert!(
        message.contains("inference.networking.k8s.io/v1"),
        "{message}"
    );
    assert!(message.contains("within 1s"), "{message}");
    let ready = condition_full(&client, &ns, "llama", "Ready")
        .await
        .unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "PoolAPIMissing")
    );
    eventually("a PoolAPIMissing Event", TIMEOUT, || async {
        policy_events(&client, &ns, "llama")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("PoolAPIMissing"))
    })
    .await;
    assert_eq!(
        children_of(&client, &ns, "llama").await,
        Vec::<String>::new()
    );

    // The real InferencePool CRD appears: the operator notices on its own (no event about the
    // policy), and now the pool itself is what is missing.
    let crd = repo().join(
        "tests/fixtures/gateway-api-inference-extension/inference.networking.k8s.io_inferencepools.yaml",
    );
    kubectl(
        control_plane,
        &["apply", "--server-side", "-f", crd.to_str().unwrap()],
        None,
    );
    kubectl(
        control_plane,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/inferencepools.inference.networking.k8s.io",
        ],
        None,
    );
    let started = std::time::Instant::now();
    let (_, _, message) = why("PoolNotFound").await;
    println!(
        "PoolAPIMissing -> PoolNotFound {:.1} s after the CRD was established",
        started.elapsed().as_secs_f64()
    );
    assert!(message.contains(&format!("{ns}/llama-pool")), "{message}");

    // The pool and a ready pod: endpoints, children, the producer's config.
    let pool = format!(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  name: llama-pool\n  namespace: {ns}\nspec:\n  selector:\n    matchLabels: {{app: llama}}\n  targetPorts: [{{number: 8000}}, {{number: 8001}}]\n  endpointPickerRef:\n    name: llama-producer\n    port: {{number: 9002}}\n"
    );
    kubectl(control_plane, &["apply", "-f", "-"], Some(&pool));
    create_pod(&client, &ns, "llama-0", "llama").await;
    set_pod_status(&client, &ns, "llama-0", "10.3.0.1", true).await;
    let config = eventually("the pool's endpoints in the ConfigMap", TIMEOUT, || async {
        producer_config(&client, &ns, "llama-producer")
            .await
            .filter(|c| c.endpoints.len() == 2)
    })
    .await;
    assert_eq!(config.endpoints[1].address, "10.3.0.1:8001");
    why("Discovered").await;
    // The Service has the port the pool's endpointPickerRef names.
    let service = kubectl(
        control_plane,
        &["get", "service", "llama-producer", "-n", &ns, "-o", "json"],
        None,
    );
    let service: serde_json::Value = serde_json::from_str(&service).unwrap();
    let epp = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "epp")
        .unwrap()
        .clone();
    assert_eq!(epp["port"], 9002);
    // TLS by default (self-signed): HTTP/2 over TLS, GAIE's endpoint-picker convention.
    assert_eq!(epp["appProtocol"], "http2");

    // The producer's KV-event port admits the pool's pods, and follows the pool's selector.
    let event_rule = || async {
        let policy = kubectl(
            control_plane,
            &[
                "get",
                "networkpolicy",
                "llama-producer",
                "-n",
                &ns,
                "-o",
                "json",
            ],
            None,
        );
        let policy: serde_json::Value = serde_json::from_str(&policy).unwrap();
        policy["spec"]["ingress"].clone()
    };
    assert_eq!(
        event_rule().await,
        json!([{"ports": [{"port": 5557, "protocol": "TCP"}],
                "from": [{"podSelector": {"matchLabels": {"app": "llama"}}}]}])
    );
    kubectl(
        control_plane,
        &["apply", "-f", "-"],
        Some(&pool.replace("{app: llama}", "{app: llama-v2}")),
    );
    eventually("the event rule to follow the pool", TIMEOUT, || async {
        let rule = event_rule().await;
        (rule[0]["from"][0]["podSelector"]["matchLabels"]["app"] == "llama-v2").then_some(())
    })
    .await;
    drop(operator);
    the_endpoint_picker_example_passes_the_real_schemas(control_plane).await;
}

/// examples/inferencepool-policy.yaml (an InferencePool whose endpointPickerRef names the
/// policy's producer Service, and the policy) is accepted by the real InferencePool v1 schema
/// and the CRD, and the port it names is the producer's endpoint-picker port. Called once the
/// test above installed the InferencePool CRD (the tests of one binary run at once, and that
/// one needs the API missing first).
async fn the_endpoint_picker_example_passes_the_real_schemas(control_plane: &ControlPlane) {
    let ns = control_plane.namespace("epp-example").await.unwrap();
    let example = repo().join("examples/inferencepool-policy.yaml");
    let output = kubectl(
        control_plane,
        &[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-n",
            &ns,
            "-f",
            example.to_str().unwrap(),
        ],
        None,
    );
    let list: serde_json::Value = serde_json::from_str(&output).unwrap();
    let items = list["items"].as_array().unwrap();
    let pool = items.iter().find(|i| i["kind"] == "InferencePool").unwrap();
    let policy = items
        .iter()
        .find(|i| i["kind"] == "BurstPrefixPolicy")
        .unwrap();
    let picker = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker["kind"], "Service");
    assert_eq!(
        picker["name"].as_str().unwrap(),
        format!("{}-producer", policy["metadata"]["name"].as_str().unwrap())
    );
    assert_eq!(
        picker["port"]["number"],
        policy["spec"]["producer"]["eppPort"]
    );
    assert_eq!(picker["failureMode"], "FailOpen");
    assert_eq!(policy["spec"]["poolRef"]["name"], pool["metadata"]["name"]);
}
