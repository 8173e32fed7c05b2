//! The operator recovers when kube-apiserver restarts: a pod change made right after the
//! restart reaches the producer's ConfigMap. Measured over three restarts (printed, not asserted:
//! the target is under 10 s; before each watch had its own backoff it was up to ~45 s). A test
//! binary of its own: the restart takes the API away from every test sharing the control plane.

mod common;

use std::time::Instant;

use common::{
    create_pod, create_policy, endpoint_ids, eventually, set_pod_status, start_operator,
    vllm_policy, Scene, TIMEOUT,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn operator_recovers_after_apiserver_restart() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("restart").await;
    let mut operator = start_operator(control_plane, &ns, &[]);
    create_policy(&client, &ns, "rl", vllm_policy(json!({}))).await;
    create_pod(&client, &ns, "vllm-0", "vllm").await;
    set_pod_status(&client, &ns, "vllm-0", "10.2.0.1", true).await;
    eventually("one endpoint", TIMEOUT, || async {
        endpoint_ids(&client, &ns)
            .await
            .filter(|ids| ids.len() == 1)
    })
    .await;

    let mut recoveries = Vec::new();
    for round in 1..=3 {
        control_plane.restart_apiserver().await.unwrap();
        // Ready: the new kube-apiserver answers /readyz. From here, how long until a change
        // made now reaches the ConfigMap (every watch resumes from a resource version the new
        // server's cache may not have, and relists).
        let client = control_plane.client();
        let started = Instant::now();
        let pod = format!("vllm-{round}");
        create_pod(&client, &ns, &pod, "vllm").await;
        set_pod_status(&client, &ns, &pod, &format!("10.2.0.{}", round + 1), true).await;
        eventually(
            &format!("endpoint {} after restart {round}", round + 1),
            TIMEOUT,
            || async {
                endpoint_ids(&client, &ns)
                    .await
                    .filter(|ids| ids.len() == round + 1)
            },
        )
        .await;
        recoveries.push(started.elapsed().as_secs_f64());
    }
    println!("pod change after an API server restart reached the ConfigMap in {recoveries:.2?} s");
    assert_eq!(
        operator.exit_code(),
        None,
        "the operator kept running:\n{}",
        operator.log_text()
    );
}
