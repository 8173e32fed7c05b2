//! Restarting kube-apiserver keeps the port and the stored objects. A test binary of its own:
//! the restart takes the API away from every test sharing the control plane.

use burst_prefix_test_support::ControlPlane;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

#[tokio::test]
async fn restart_keeps_the_url_and_the_objects() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace("restart").await.unwrap();
    let url = control_plane.server_url().to_owned();
    let client = control_plane.client();
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("kept".into()),
            ..ObjectMeta::default()
        },
        data: Some([("key".into(), "value".into())].into()),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();

    control_plane
        .restart_apiserver()
        .await
        .expect("kube-apiserver restarts");

    assert_eq!(control_plane.server_url(), url);
    // A client made before the restart reconnects to the new process.
    let kept = Api::<ConfigMap>::namespaced(client, &namespace)
        .get("kept")
        .await
        .expect("the object survives the restart");
    assert_eq!(kept.data.unwrap()["key"], "value");
}
