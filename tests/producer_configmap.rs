//! `burst-prefix-producer serve --configmap NS/NAME` against the real kube-apiserver: the
//! ConfigMap is watched, a good update applies, a bad one is rejected and counted while the
//! last good config stays in force. The producer runs with a ServiceAccount token that may only
//! read that one ConfigMap, as the operator's Role grants.

mod common;

use common::{eventually, start_producer, Scene, TIMEOUT};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

fn config(endpoints: &[&str]) -> String {
    let mut yaml = String::from("windowDurationMs: 20\nendpoints:\n");
    for (i, id) in endpoints.iter().enumerate() {
        yaml.push_str(&format!(
            "  - id: {id}\n    address: 10.3.0.{}:8000\n",
            i + 1
        ));
    }
    yaml
}

#[tokio::test(flavor = "multi_thread")]
async fn configmap_updates_apply_and_bad_ones_are_rejected() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("producer").await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "producer"},
        "data": {"config.yaml": config(&["ns/a-rank-0"])},
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    // Exactly the producer Role the operator renders: this one ConfigMap, read-only.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "producer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["producer"], "verbs": ["get", "list", "watch"]}],
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "producer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "producer"},
        "subjects": [{"kind": "ServiceAccount", "name": "producer", "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let producer = start_producer(control_plane, &ns, "producer").await;
    let (api, admin) = (producer.api.clone(), producer.admin.clone());
    let producer = producer.process;
    let http = reqwest::Client::new();
    let get = |url: String| {
        let http = http.clone();
        async move { http.get(url).send().await.ok()?.text().await.ok() }
    };
    let endpoints_url = format!("{api}/v1/endpoints");
    let metrics_url = format!("{admin}/metrics");
    eventually("the first config", TIMEOUT, || async {
        get(endpoints_url.clone())
            .await
            .filter(|body| body.contains("ns/a-rank-0"))
    })
    .await;

    // A good update applies.
    let update = |yaml: String| {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .patch(
                    "producer",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"data": {"config.yaml": yaml}})),
                )
                .await
                .unwrap();
        }
    };
    update(config(&["ns/a-rank-0", "ns/b-rank-0"])).await;
    eventually("the second endpoint", TIMEOUT, || async {
        get(endpoints_url.clone())
            .await
            .filter(|body| body.contains("ns/b-rank-0"))
    })
    .await;

    // A bad update is rejected and counted; the last good config stays in force.
    update("windowDurationMs: -1\nendpoints: []\n".to_string()).await;
    eventually("the rejection to be counted", TIMEOUT, || async {
        get(metrics_url.clone()).await.filter(|body| {
            body.contains("burst_prefix_config_reloads_total{result=\"rejected\"} 1")
        })
    })
    .await;
    let body = get(endpoints_url.clone()).await.unwrap();
    assert!(
        body.contains("ns/a-rank-0") && body.contains("ns/b-rank-0"),
        "last good config kept: {body}\n{}",
        producer.log_text()
    );
    let answer: serde_json::Value = http
        .post(format!("{api}/v1/produce"))
        .json(&json!({"model": "m", "prompt": "still served"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["window"]["size"], 1, "{answer}");
    assert!(
        producer.log_text().contains("windowDurationMs"),
        "the rejection is logged with its reason"
    );
}
