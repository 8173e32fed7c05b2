//! The operator recovers when kube-apiserver restarts. A test binary of its own: the restart
//! takes the API away from every test sharing the control plane.

mod common;

use burst_prefix_test_support::ControlPlane;
use common::{
    create_pod, create_policy, endpoint_ids, eventually, install_crd, set_pod_status,
    start_operator, TIMEOUT,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn operator_recovers_after_apiserver_restart() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let client = control_plane.client();
    let ns = control_plane.namespace("restart").await.unwrap();
    let mut operator = start_operator(control_plane, &ns, &[]);
    create_policy(
        &client,
        &ns,
        "rl",
        json!({"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}),
    )
    .await;
    create_pod(&client, &ns, "vllm-0", "vllm").await;
    set_pod_status(&client, &ns, "vllm-0", "10.2.0.1", true).await;
    eventually("one endpoint", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 1)
    })
    .await;

    control_plane.restart_apiserver().await.unwrap();

    // A change made after the restart still reaches the ConfigMap: the watches came back. Every
    // watch resumes from a resource version the new server's cache no longer has (410), backs
    // off and relists; recovery took 1-45 s in repeated runs here, hence the long deadline.
    let client = control_plane.client();
    create_pod(&client, &ns, "vllm-1", "vllm").await;
    set_pod_status(&client, &ns, "vllm-1", "10.2.0.2", true).await;
    eventually(
        "the second endpoint after the restart",
        TIMEOUT * 3,
        || async {
            endpoint_ids(&client, &ns)
                .await
                .filter(|ids| ids.len() == 2)
        },
    )
    .await;
    assert_eq!(
        operator.exit_code(),
        None,
        "the operator kept running:\n{}",
        operator.log_text()
    );
}
