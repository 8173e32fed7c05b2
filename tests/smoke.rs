//! Smoke test of the test control plane itself: a real kube-apiserver + etcd serve CRDs,
//! custom objects and watches, and enforce RBAC.

use std::time::Duration;

use burst_prefix_test_support::ControlPlane;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::{Api, Client};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A small CRD of the smoke test's own, not the project's.
fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.smoke.burst-prefix.test" },
        "spec": {
            "group": "smoke.burst-prefix.test",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": { "size": { "type": "integer", "minimum": 1 } }
                    }}
                }}
            }]
        }
    }))
    .expect("the CRD is valid")
}

fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("smoke.burst-prefix.test", "v1", "Widget"),
        "widgets",
    )
}

/// Applies the CRD (idempotent: several tests share the control plane) and waits until it is
/// Established, i.e. its objects can be served.
async fn install_widget_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = widget_crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &name,
        &PatchParams::apply("burst-prefix-smoke").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("applying the CRD");
    let established = kube::runtime::wait::await_condition(
        crds,
        &name,
        kube::runtime::wait::conditions::is_crd_established(),
    );
    tokio::time::timeout(TIMEOUT, established)
        .await
        .expect("the CRD is established in time")
        .expect("watching the CRD");
}

fn widget(name: &str, size: i64) -> DynamicObject {
    DynamicObject::new(name, &widget_resource()).data(json!({ "spec": { "size": size } }))
}

#[tokio::test]
async fn custom_objects_are_stored_validated_and_watched() {
    let control_plane = ControlPlane::shared();
    let client = control_plane.client();
    let namespace = control_plane.namespace("smoke-crd").await.unwrap();
    install_widget_crd(&client).await;
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &widget_resource());

    // Watch first, then create: the watch must report the new object (after any bookmarks).
    let mut events = widgets
        .watch(&WatchParams::default(), "0")
        .await
        .expect("starting a watch")
        .boxed();
    widgets
        .create(&PostParams::default(), &widget("first", 3))
        .await
        .expect("creating a widget");
    let next_change = async {
        loop {
            match events.try_next().await {
                Ok(Some(WatchEvent::Bookmark(_))) => continue,
                other => return other,
            }
        }
    };
    let event = tokio::time::timeout(TIMEOUT, next_change)
        .await
        .expect("a watch event in time")
        .expect("the watch stream")
        .expect("the watch is still open");
    match event {
        WatchEvent::Added(object) => {
            assert_eq!(object.metadata.name.as_deref(), Some("first"));
            assert_eq!(object.data["spec"]["size"], 3);
        }
        other => panic!("expected Added for the new widget, got {other:?}"),
    }

    // The CRD's schema is enforced by the API server.
    let invalid = widgets
        .create(&PostParams::default(), &widget("second", 0))
        .await
        .expect_err("size 0 violates the schema's minimum");
    assert!(
        matches!(&invalid, kube::Error::Api(status) if status.code == 422),
        "expected 422 Invalid, got {invalid:?}"
    );
}

#[tokio::test]
async fn rbac_refuses_the_non_admin_user_and_admits_the_admin() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace("smoke-rbac").await.unwrap();
    let user = control_plane.client_for(&control_plane.user().token);

    let denied = Api::<ConfigMap>::namespaced(user, &namespace)
        .list(&ListParams::default())
        .await
        .expect_err("the non-admin user has no RBAC binding");
    assert!(
        matches!(&denied, kube::Error::Api(status) if status.code == 403),
        "expected 403 Forbidden, got {denied:?}"
    );

    let admin = Api::<ConfigMap>::namespaced(control_plane.client(), &namespace);
    admin
        .list(&ListParams::default())
        .await
        .expect("the admin may list config maps");
}

#[tokio::test]
async fn service_account_tokens_authenticate_as_the_service_account() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace("smoke-sa").await.unwrap();
    let token = control_plane
        .service_account_token(&namespace, "operator")
        .await
        .expect("a token for the service account");

    let review = Api::<SelfSubjectReview>::all(control_plane.client_for(&token))
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("any authenticated user may review itself");
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{namespace}:operator").as_str())
    );
    assert!(user
        .groups
        .unwrap_or_default()
        .contains(&format!("system:serviceaccounts:{namespace}")));
}

#[tokio::test]
async fn kubectl_and_helm_use_the_admin_kubeconfig() {
    let control_plane = ControlPlane::shared();
    let namespace = control_plane.namespace("smoke-cli").await.unwrap();

    let kubectl = control_plane
        .kubectl()
        .args(["get", "namespace", &namespace, "-o", "name"])
        .output()
        .expect("running kubectl");
    assert!(kubectl.status.success(), "kubectl failed: {kubectl:?}");
    assert_eq!(
        String::from_utf8_lossy(&kubectl.stdout).trim(),
        format!("namespace/{namespace}")
    );

    let helm = control_plane
        .helm()
        .args(["list", "--namespace", &namespace, "--output", "json"])
        .output()
        .expect("running helm");
    assert!(helm.status.success(), "helm failed: {helm:?}");
    assert_eq!(String::from_utf8_lossy(&helm.stdout).trim(), "[]");

    // The namespace exists for the Rust client too.
    Api::<Namespace>::all(control_plane.client())
        .get(&namespace)
        .await
        .expect("the namespace exists");
}
