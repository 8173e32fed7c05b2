//! The Helm chart (charts/burst-prefix) and the example policies against a real kube-apiserver:
//! `helm lint --strict`; rendering with default and non-default values, checked by the API server
//! (server-side dry run); bad values refused by the schema; the examples accepted by the CRD; and
//! `helm install`, after which the real operator runs out of cluster with the token of the
//! chart's own ServiceAccount, so with exactly the RBAC the chart grants (RBAC is enforced here),
//! and `helm uninstall`, after which nothing of the release is left but the CRD.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_test_support::ControlPlane;
use common::{
    binary, condition, create_pod, create_policy, eventually, free_port, install_crd,
    producer_config, repo, set_pod_status, vllm_policy, Process, TIMEOUT,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::sync::Mutex;

/// Tests that run an operator hold this: a cluster-wide operator would also reconcile the
/// policies of the namespaced test, which would then not show that its own RBAC suffices.
static OPERATOR: Mutex<()> = Mutex::const_new(());

fn chart() -> PathBuf {
    repo().join("charts/burst-prefix")
}

/// Runs `command`, feeding it `stdin`: its stdout on success, else its stderr and stdout.
fn run(command: &mut Command, stdin: Option<&str>) -> Result<String, String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input); // EOF
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{}{stdout}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `helm template <release> charts/burst-prefix -n <namespace> <args>`.
fn helm_template(
    control_plane: &ControlPlane,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<String, String> {
    let mut helm = control_plane.helm();
    helm.arg("template")
        .arg(release)
        .arg(chart())
        .args(["--namespace", namespace])
        .args(args);
    run(&mut helm, None)
}

/// The manifest applied with `kubectl apply --server-side --dry-run=server`: the objects as the
/// API server would store them, after its validation and admission.
fn server_dry_run(control_plane: &ControlPlane, manifest: &str) -> Vec<Value> {
    let output = run(
        control_plane.kubectl().args([
            "apply",
            "--server-side",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
        ]),
        Some(manifest),
    )
    .unwrap_or_else(|e| panic!("the API server refused the chart's objects: {e}\n{manifest}"));
    let value: Value = serde_json::from_str(&output).unwrap();
    match value["kind"].as_str() {
        Some("List") => value["items"].as_array().unwrap().clone(),
        _ => vec![value],
    }
}

/// The objects of `kind`.
fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    kinds
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn lint_is_clean_with_strict() {
    let control_plane = ControlPlane::shared();
    for values in [
        vec![],
        vec![
            "--set",
            "replicas=2",
            "--set",
            "watchNamespaces={ml,ops}",
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "producer.podMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "crds.install=false",
        ],
    ] {
        let output = run(
            control_plane
                .helm()
                .args(["lint", "--strict"])
                .arg(chart())
                .args(&values),
            None,
        )
        .unwrap_or_else(|e| panic!("helm lint --strict {values:?}: {e}"));
        assert!(output.contains("0 chart(s) failed"), "{output}");
    }
}

/// The hardening, probes and environment every rendering of the operator Deployment has.
fn assert_hardened_operator(deployment: &Value, service_account: &str) {
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], service_account);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true, "{security}");
    assert_eq!(security["readOnlyRootFilesystem"], true, "{security}");
    assert_eq!(security["allowPrivilegeEscalation"], false, "{security}");
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    assert_eq!(container["ports"][0]["name"], "admin");
    assert_eq!(container["ports"][0]["containerPort"], 8081);
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    let downward: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert!(
        downward.contains(&("POD_NAME", "metadata.name")),
        "{downward:?}"
    );
    assert!(
        downward.contains(&("POD_NAMESPACE", "metadata.namespace")),
        "{downward:?}"
    );
    assert!(strings(&container["args"]).contains(&"--admin-listen=0.0.0.0:8081"));
}

#[tokio::test(flavor = "multi_thread")]
async fn default_values_render_objects_the_api_server_accepts() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("chart-default").await.unwrap();
    let manifest = helm_template(control_plane, "burst-prefix", &ns, &[]).unwrap();
    let objects = server_dry_run(control_plane, &manifest);
    // Cluster-wide, one replica: no leader election, so no Lease, Role or PodDisruptionBudget.
    // The CRD is a template (crds.install), and so is the `helm test` Pod.
    assert_eq!(
        kinds(&objects),
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Pod",
            "Service",
            "ServiceAccount"
        ]
    );
    for object in &objects {
        let labels = &object["metadata"]["labels"];
        let kind = object["kind"].as_str().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{kind}");
        if kind == "CustomResourceDefinition" {
            // The cluster's, not the release's: kept on uninstall.
            assert_eq!(labels["app.kubernetes.io/instance"], Value::Null);
            assert_eq!(
                object["metadata"]["annotations"]["helm.sh/resource-policy"],
                "keep"
            );
            continue;
        }
        assert_eq!(
            labels["app.kubernetes.io/instance"], "burst-prefix",
            "{kind}"
        );
        if !kind.starts_with("Cluster") {
            assert_eq!(object["metadata"]["namespace"], ns.as_str(), "{object}");
        }
    }
    // The chart renders the CRD the code generates (crates/operator/tests/crd_drift.rs keeps
    // the file in step).
    let crd = of_kind(&objects, "CustomResourceDefinition")[0];
    let generated = burst_prefix_api::policy::crd();
    let columns = |versions: &Value| -> Vec<String> {
        versions[0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        columns(&crd["spec"]["versions"]),
        generated.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>()
    );

    let deployment = of_kind(&objects, "Deployment")[0];
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_hardened_operator(deployment, "burst-prefix");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["affinity"],
        Value::Null,
        "one replica: no anti-affinity"
    );
    let args = strings(&pod["containers"][0]["args"]);
    assert_eq!(
        args,
        [
            "run",
            "--admin-listen=0.0.0.0:8081",
            "--producer-image=ghcr.io/burst-prefix/burst-prefix-producer:0.1.0",
            r#"--producer-resources={"limits":{"memory":"512Mi"},"requests":{"cpu":"100m","memory":"64Mi"}}"#,
            "--pool-api-recheck-seconds=30",
            "--api-refusal-grace-seconds=30",
            "--log-format=json",
            "--log-level=info"
        ]
    );
    let image = &pod["containers"][0]["image"];
    assert_eq!(image, "ghcr.io/burst-prefix/burst-prefix-operator:0.1.0");
    // The cluster-wide write path is its own, named ClusterRole.
    for half in ["read", "write"] {
        let binding = of_kind(&objects, "ClusterRoleBinding")
            .into_iter()
            .find(|b| b["metadata"]["name"] == format!("burst-prefix-{half}"))
            .unwrap_or_else(|| panic!("ClusterRoleBinding burst-prefix-{half}"));
        assert_eq!(binding["roleRef"]["name"], format!("burst-prefix-{half}"));
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "burst-prefix", "namespace": ns}])
        );
    }
    let write = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "burst-prefix-write")
        .unwrap();
    let write_verbs: Vec<&str> = write["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| strings(&r["verbs"]))
        .collect();
    assert!(
        write_verbs
            .iter()
            .all(|v| ["create", "patch", "delete", "get"].contains(v)),
        "{write_verbs:?}"
    );
    let service = of_kind(&objects, "Service")[0];
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/component"],
        "operator"
    );
    // `helm test`: the operator's /readyz through its Service, from a hardened pod.
    let test = of_kind(&objects, "Pod")[0];
    assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
    let command = strings(&test["spec"]["containers"][0]["command"]).join(" ");
    assert!(
        command.ends_with(&format!("http://burst-prefix-metrics.{ns}.svc:8081/readyz")),
        "{command}"
    );
    assert_eq!(test["spec"]["securityContext"]["runAsNonRoot"], true);
}

/// Enough of the Prometheus Operator's CRDs for the API server to serve their kinds.
fn monitoring_crd(kind: &str, plural: &str) -> String {
    format!(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {{kind: {kind}, plural: {plural}, singular: {singular}}}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"#,
        singular = kind.to_lowercase()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn non_default_values_render_objects_the_api_server_accepts() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PodMonitor", "podmonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        run(
            control_plane
                .kubectl()
                .args(["apply", "--server-side", "-f", "-"]),
            Some(&monitoring_crd(kind, plural)),
        )
        .unwrap();
        run(
            control_plane.kubectl().args([
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{plural}.monitoring.coreos.com"),
            ]),
            None,
        )
        .unwrap();
    }
    let ns = control_plane.namespace("chart-custom").await.unwrap();
    let watched = control_plane.namespace("chart-watched").await.unwrap();
    let also = control_plane.namespace("chart-watched-too").await.unwrap();
    let watch = format!("watchNamespaces={{{watched},{also}}}");
    let values = [
        "--set",
        "replicas=2",
        "--set",
        watch.as_str(),
        "--set",
        "crds.install=false",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "serviceMonitor.labels.release=prometheus",
        "--set",
        "producer.podMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "image.tag=dev",
        "--set",
        "imageRegistry=mirror.internal:5000",
        "--set",
        "producer.image.tag=1.2.3",
        "--set",
        "producer.image.pullPolicy=Always",
        "--set",
        "producer.imagePullSecrets[0].name=regcred",
        "--set",
        "producer.resources.limits.memory=1Gi",
        "--set",
        "producer.allowedImagePrefixes={mirror.internal:5000/}",
        "--set",
        "producer.networkPolicy.enabled=true",
        "--set-json",
        r#"producer.networkPolicy.endpointPicker=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"gateways"}}}]"#,
        "--set-json",
        "producer.networkPolicy.admin=[]",
        "--set",
        "podSelector=app.kubernetes.io/component=model-server",
        "--set",
        "logFormat=text",
        "--set",
        "nodeSelector.pool=system",
        "--set",
        "priorityClassName=system-cluster-critical",
        "--set",
        "podLabels.team=ml-platform",
        "--set",
        "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=op@p.iam.gserviceaccount.com",
        "--set",
        "extraArgs={--retry-max-seconds=60}",
        "--set-json",
        r#"extraEnv=[{"name":"HTTPS_PROXY","value":"http://proxy:3128"}]"#,
        "--set-json",
        r#"topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway","labelSelector":{"matchLabels":{"app.kubernetes.io/component":"operator"}}}]"#,
        "--set-json",
        r#"securityContext={"runAsNonRoot":true,"readOnlyRootFilesystem":true,"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]},"seccompProfile":{"type":"RuntimeDefault"},"runAsUser":1000}"#,
    ];
    let api = [
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions",
        "monitoring.coreos.com/v1/PodMonitor",
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
    ];
    let manifest =
        helm_template(control_plane, "bp", &ns, &[&values[..], &api[..]].concat()).unwrap();
    let objects = server_dry_run(control_plane, &manifest);
    // Two watched namespaces: a Role and RoleBinding in each, no cluster-wide role for the
    // operator (the aggregated edit/view ClusterRoles grant it nothing). Two replicas: leader
    // election (its Lease and Role) and a PodDisruptionBudget.
    assert_eq!(
        kinds(&objects),
        [
            "ClusterRole",
            "ClusterRole",
            "ConfigMap",
            "Deployment",
            "Lease",
            "Pod",
            "PodDisruptionBudget",
            "PodMonitor",
            "PrometheusRule",
            "Role",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
    );
    let fullname = "bp-burst-prefix";
    let roles = of_kind(&objects, "Role");
    for namespace in [&watched, &also] {
        let role = roles
            .iter()
            .find(|r| r["metadata"]["namespace"] == namespace.as_str())
            .unwrap_or_else(|| panic!("a Role in {namespace}"));
        assert_eq!(role["metadata"]["name"], fullname);
    }
    let lease_role = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == ns.as_str())
        .expect("the leader-election Role in the release namespace");
    assert_eq!(
        lease_role["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": [fullname], "verbs": ["get", "patch"]}])
    );
    for binding in of_kind(&objects, "RoleBinding") {
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": fullname, "namespace": ns}])
        );
    }
    let account = of_kind(&objects, "ServiceAccount")[0];
    assert_eq!(
        account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
        "op@p.iam.gserviceaccount.com"
    );
    let deployment = of_kind(&objects, "Deployment")[0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_hardened_operator(deployment, fullname);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"pool": "system"}));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["team"],
        "ml-platform"
    );
    // Two replicas and no affinity given: one per node, preferably.
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        anti["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        "mirror.internal:5000/burst-prefix/burst-prefix-operator:dev"
    );
    assert_eq!(container["securityContext"]["runAsUser"], 1000);
    assert!(container["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "HTTPS_PROXY" && e["value"] == "http://proxy:3128"));
    let args = strings(&container["args"]);
    let watch_arg = format!("--watch-namespace={watched},{also}");
    let lease_arg = format!("--lease-name={fullname}");
    for expected in [
        watch_arg.as_str(),
        "--leader-elect",
        lease_arg.as_str(),
        "--lease-duration-seconds=15",
        "--log-format=text",
        "--pod-selector=app.kubernetes.io/component=model-server",
        "--producer-image=mirror.internal:5000/burst-prefix/burst-prefix-producer:1.2.3",
        "--producer-image-pull-policy=Always",
        "--producer-image-pull-secret=regcred",
        r#"--producer-resources={"limits":{"memory":"1Gi"},"requests":{"cpu":"100m","memory":"64Mi"}}"#,
        "--allowed-producer-image-prefix=mirror.internal:5000/",
        r#"--producer-network-policy={"admin":[],"api":[{"podSelector":{}}],"endpointPicker":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"gateways"}}}]}"#,
        "--retry-max-seconds=60",
    ] {
        assert!(args.contains(&expected), "{expected} in {args:?}");
    }
    assert_eq!(
        args.last(),
        Some(&"--retry-max-seconds=60"),
        "extraArgs come last"
    );
    assert_eq!(
        of_kind(&objects, "PodDisruptionBudget")[0]["spec"]["minAvailable"],
        1
    );
    let monitor = of_kind(&objects, "ServiceMonitor")[0];
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    // Every producer pod of the watched namespaces, on its metrics port.
    let producers = of_kind(&objects, "PodMonitor")[0];
    assert_eq!(
        producers["spec"]["namespaceSelector"]["matchNames"],
        json!([watched, also])
    );
    assert_eq!(
        producers["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "burst-prefix-producer"
    );
    assert_eq!(
        producers["spec"]["podMetricsEndpoints"][0]["port"],
        "metrics"
    );
    let rules = of_kind(&objects, "PrometheusRule")[0];
    let alerts: Vec<&str> = rules["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(
        alerts,
        [
            "BurstPrefixProducerNoEndpoints",
            "BurstPrefixReconcileErrors",
            "BurstPrefixRequestsRejected",
            "BurstPrefixPlanningSlow"
        ]
    );
    let dashboard = of_kind(&objects, "ConfigMap")[0];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["burst-prefix.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "burst-prefix");
    // The edit and view roles of the namespaces' users, extended to policies.
    let aggregated = of_kind(&objects, "ClusterRole");
    let edit = aggregated
        .iter()
        .find(|r| r["metadata"]["name"] == format!("{fullname}-edit"))
        .unwrap();
    assert_eq!(
        edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    let view = aggregated
        .iter()
        .find(|r| r["metadata"]["name"] == format!("{fullname}-view"))
        .unwrap();
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );

    // Leader election asked for with one replica: the Lease and its Role, no PodDisruptionBudget.
    let one = helm_template(
        control_plane,
        "bp",
        &ns,
        &[
            "--set",
            "leaderElection.enabled=true",
            "--set",
            "crds.install=false",
        ],
    )
    .unwrap();
    let objects = server_dry_run(control_plane, &one);
    assert_eq!(of_kind(&objects, "Lease").len(), 1);
    assert!(of_kind(&objects, "PodDisruptionBudget").is_empty());
    let args = strings(
        &of_kind(&objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"],
    )
    .join(" ");
    assert!(
        args.contains("--leader-elect --lease-name=bp-burst-prefix"),
        "{args}"
    );

    // Where the APIs are not served, the monitoring objects are not rendered (and NOTES.txt
    // says why).
    let without_api = helm_template(control_plane, "bp", &ns, &values).unwrap();
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(!without_api.contains(&format!("kind: {kind}")), "{kind}");
    }
}

/// The aggregated roles' rules work: a user bound to `<release>-edit` may manage policies, one
/// bound to `<release>-view` may only read them. (The aggregation into the built-in admin, edit
/// and view roles is kube-controller-manager's, which does not run here; the labels are
/// checked above.)
#[tokio::test(flavor = "multi_thread")]
async fn aggregated_roles_let_namespace_users_edit_or_view_policies() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("chart-aggregated").await.unwrap();
    let manifest = helm_template(
        control_plane,
        "agg",
        &ns,
        &[
            "--set",
            "crds.install=false",
            "--show-only",
            "templates/aggregated-roles.yaml",
        ],
    )
    .unwrap();
    run(
        control_plane
            .kubectl()
            .args(["apply", "--server-side", "-f", "-"]),
        Some(&manifest),
    )
    .unwrap();
    let client = control_plane.client();
    for (user, role) in [
        ("editor", "agg-burst-prefix-edit"),
        ("viewer", "agg-burst-prefix-view"),
    ] {
        let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": user, "namespace": ns}],
        }))
        .unwrap();
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    let editor = control_plane.client_for(
        &control_plane
            .service_account_token(&ns, "editor")
            .await
            .unwrap(),
    );
    let viewer = control_plane.client_for(
        &control_plane
            .service_account_token(&ns, "viewer")
            .await
            .unwrap(),
    );
    let policy = |verb| (verb, "burstprefix.io", "burstprefixpolicies");
    for (client, verb, allowed) in [
        (&editor, "create", true),
        (&editor, "delete", true),
        (&editor, "update", true),
        (&viewer, "get", true),
        (&viewer, "list", true),
        (&viewer, "create", false),
        (&viewer, "delete", false),
    ] {
        let (verb, group, resource) = policy(verb);
        assert_eq!(
            may(client, verb, group, resource, Some(&ns), None).await,
            allowed,
            "{verb}"
        );
    }
    // Nobody may write a status but the operator.
    assert!(
        !may(
            &editor,
            "patch",
            "burstprefix.io",
            "burstprefixpolicies/status",
            Some(&ns),
            None
        )
        .await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_values_are_refused_by_the_schema_with_a_clear_message() {
    let control_plane = ControlPlane::shared();
    let schema_error = "values don't meet the specifications of the schema";
    let cases: &[(&str, &[&str])] = &[
        (
            "watchNamespaces={Not_A_Namespace}",
            &["/watchNamespaces/0", "does not match pattern"],
        ),
        (
            "watchNamespaces={ml,ml}",
            &["/watchNamespaces", "items at 0 and 1 are equal"],
        ),
        ("replicas=-1", &["/replicas", "minimum"]),
        ("logFormat=xml", &["/logFormat", "'json', 'text'"]),
        (
            "image.pullPolicy=Sometimes",
            &["/image/pullPolicy", "'IfNotPresent'"],
        ),
        (
            "leaderElection.leaseDurationSeconds=1",
            &["/leaderElection/leaseDurationSeconds", "minimum"],
        ),
        (
            "serviceMonitor.interval=often",
            &["/serviceMonitor/interval", "pattern"],
        ),
        (
            "resources.limits.memory=lots",
            &["/resources/limits/memory", "pattern"],
        ),
        ("logLevel=info debug", &["/logLevel", "pattern"]),
        // additionalProperties: false, at the top level and below it.
        (
            "replicaCount=2",
            &["additional properties 'replicaCount' not allowed"],
        ),
        (
            "podSelector=app in (a b)",
            &["/podSelector", "does not match pattern"],
        ),
        (
            "producer.image.pullPolicy=Sometimes",
            &["/producer/image/pullPolicy", "'Always'"],
        ),
        (
            "extraArgs={retry}",
            &["/extraArgs/0", "does not match pattern"],
        ),
        (
            "serviceMonitor.enable=true",
            &[
                "/serviceMonitor",
                "additional properties 'enable' not allowed",
            ],
        ),
        // A misspelled peer field would widen the peer if it were dropped: refused.
        (
            "producer.networkPolicy.api[0].podSelectr.matchLabels.app=client",
            &[
                "/producer/networkPolicy/api/0",
                "additional properties 'podSelectr' not allowed",
            ],
        ),
        (
            "producer.networkPolicy.admin[0].ipBlock.cidr=everyone",
            &["/producer/networkPolicy/admin/0/ipBlock/cidr", "pattern"],
        ),
    ];
    for (value, expected) in cases {
        let error = helm_template(control_plane, "bp", "default", &["--set", value])
            .expect_err(&format!("{value} should be refused"));
        assert!(error.contains(schema_error), "{value}: {error}");
        for part in *expected {
            assert!(
                error.contains(part),
                "{value}: expected {part:?} in: {error}"
            );
        }
    }
    // The list must hold strings.
    let error = helm_template(
        control_plane,
        "bp",
        "default",
        &["--set-json", "watchNamespaces=[1]"],
    )
    .unwrap_err();
    assert!(error.contains("/watchNamespaces/0"), "{error}");

    // helm install refuses too, before creating anything.
    let ns = control_plane.namespace("chart-bad").await.unwrap();
    let mut install = control_plane.helm();
    install
        .args(["install", "bad", "--namespace", &ns])
        .arg(chart())
        .args(["--set", "replicas=-1"]);
    let error = run(&mut install, None).unwrap_err();
    assert!(error.contains("/replicas"), "{error}");
    let releases = run(
        control_plane
            .helm()
            .args(["list", "-q", "--namespace", &ns]),
        None,
    )
    .unwrap();
    assert_eq!(releases.trim(), "");
    let accounts = Api::<ServiceAccount>::namespaced(control_plane.client(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(accounts.items.is_empty());
}

/// The selector examples pass the CRD and the operator's validation. (The InferencePool example
/// is checked against the real InferencePool schema in tests/inference_pool.rs.)
#[tokio::test(flavor = "multi_thread")]
async fn example_policies_pass_server_side_dry_run() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("examples").await.unwrap();
    let mut seen = Vec::new();
    for example in ["vllm-policy.yaml", "rl-rollout-policy.yaml"] {
        let output = run(
            control_plane
                .kubectl()
                .args([
                    "apply",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "--namespace",
                    &ns,
                    "-f",
                ])
                .arg(repo().join("examples").join(example)),
            None,
        )
        .unwrap_or_else(|e| panic!("examples/{example} is refused: {e}"));
        let policy: BurstPrefixPolicy = serde_json::from_str(&output)
            .unwrap_or_else(|e| panic!("examples/{example}: {e}: {output}"));
        // The operator's own validation (the one the producer applies too) agrees.
        policy
            .spec
            .planner
            .validate()
            .unwrap_or_else(|e| panic!("examples/{example}: {e}"));
        // No image: the operator's --producer-image (the chart's producer.image) decides.
        assert_eq!(policy.spec.producer.image, None, "{example}");
        seen.push(policy);
    }
    let [vllm, rl] = &seen[..] else {
        unreachable!()
    };
    assert_eq!(vllm.spec.target_ports[0].number, 8000);
    assert!(vllm.spec.selector.is_some() && vllm.spec.pool_ref.is_none());
    assert_eq!(rl.spec.planner.max_per_replica, 4);
    assert_eq!(rl.spec.planner.min_colocate_blocks, 0);
}

/// examples/vllm-kv-events-policy.yaml: the vLLM Deployment and the policy pass the API server
/// (server-side dry run) and agree: the policy selects the Deployment's pods on its `--port`,
/// connects to the event and replay ports the engines bind (their `--kv-events-config` and
/// container ports), and mounts the claim the engines load the model from, at the model's
/// directory.
#[tokio::test(flavor = "multi_thread")]
async fn the_kv_events_example_agrees_with_its_vllm_deployment() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("kv-example").await.unwrap();
    let output = run(
        control_plane
            .kubectl()
            .args([
                "apply",
                "--dry-run=server",
                "-o",
                "json",
                "--namespace",
                &ns,
                "-f",
            ])
            .arg(repo().join("examples/vllm-kv-events-policy.yaml")),
        None,
    )
    .unwrap_or_else(|e| panic!("examples/vllm-kv-events-policy.yaml is refused: {e}"));
    let list: Value = serde_json::from_str(&output).unwrap();
    let items = list["items"].as_array().unwrap();
    let deployment: Deployment = serde_json::from_value(items[0].clone()).unwrap();
    let policy: BurstPrefixPolicy = serde_json::from_value(items[1].clone()).unwrap();
    policy.spec.planner.validate().unwrap();

    let pod = deployment.spec.template;
    let labels = pod.metadata.unwrap().labels.unwrap();
    let selector = policy.spec.selector.clone().unwrap().match_labels.unwrap();
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "{selector:?} selects {labels:?}"
    );
    let pod = pod.spec.unwrap();
    let vllm = &pod.containers[0];
    let args = vllm.args.clone().unwrap();
    let flag = |name: &str| {
        let at = args.iter().position(|a| a == name).unwrap();
        args[at + 1].clone()
    };
    let events: Value = serde_json::from_str(&flag("--kv-events-config")).unwrap();
    assert_eq!(events["enable_kv_cache_events"], true);
    assert_eq!(events["publisher"], "zmq");
    let container_port = |name: &str| {
        vllm.ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap()
            .container_port as i64
    };
    let kv = policy.spec.planner.engines.kv_events.clone().unwrap();
    assert_eq!(kv.bind, None, "the connect topology");
    // vLLM binds because the endpoint has `*`; the producer connects to that port and the
    // replay port.
    assert_eq!(events["endpoint"], format!("tcp://*:{}", kv.connect_port));
    assert_eq!(
        events["replay_endpoint"],
        format!("tcp://*:{}", kv.replay_port)
    );
    assert_eq!(container_port("kv-events"), kv.connect_port);
    assert_eq!(container_port("kv-replay"), kv.replay_port);
    assert!(args.contains(&format!("--port={}", policy.spec.target_ports[0].number)));
    assert!(policy.spec.planner.engines.load_interval_ms > 0);

    // The producers mount the engines' claim at the model's directory.
    let tokenizer = policy.spec.producer.tokenizer.clone().unwrap();
    let engines_claim = pod.volumes.unwrap()[0]
        .persistent_volume_claim
        .clone()
        .unwrap();
    assert_eq!(
        tokenizer.persistent_volume_claim.as_deref(),
        Some(engines_claim.claim_name.as_str())
    );
    let mount = &vllm.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        args[0],
        format!("{}/{}", mount.mount_path, tokenizer.sub_path.unwrap())
    );
    assert_eq!(
        policy.spec.planner.engines.tokenizer, None,
        "the mounted one"
    );
    assert_eq!(policy.spec.producer.replicas, 2);
}

/// The producer's TLS and drain fields: accepted by the CRD as documented, refused (with the
/// field and the rule's message) when they contradict each other or break a bound.
#[tokio::test(flavor = "multi_thread")]
async fn tls_and_drain_fields_pass_the_crd_and_contradictions_are_refused() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let ns = control_plane.namespace("tls-fields").await.unwrap();
    let dry_run = |producer: Value| {
        let policy = json!({
            "apiVersion": "burstprefix.io/v1alpha1",
            "kind": "BurstPrefixPolicy",
            "metadata": {"name": "tls"},
            "spec": vllm_policy(json!({"producer": producer})),
        });
        run(
            control_plane.kubectl().args([
                "apply",
                "--dry-run=server",
                "-o",
                "json",
                "--namespace",
                &ns,
                "-f",
                "-",
            ]),
            Some(&policy.to_string()),
        )
    };
    let accepted = dry_run(json!({
        "eppTls": {"secretName": "picker-cert"},
        "apiTls": {"secretName": "api.cert-1"},
        "drainTimeoutMs": 300_000,
    }))
    .unwrap_or_else(|e| panic!("refused: {e}"));
    let policy: BurstPrefixPolicy = serde_json::from_str(&accepted).unwrap();
    let producer = &policy.spec.producer;
    assert_eq!(
        producer.epp_tls.as_ref().unwrap().secret_name.as_deref(),
        Some("picker-cert")
    );
    assert_eq!(producer.api_tls.as_ref().unwrap().secret_name, "api.cert-1");
    assert_eq!(producer.drain_timeout_ms, Some(300_000));
    dry_run(json!({"eppTls": {"plaintext": true}, "drainTimeoutMs": 0}))
        .unwrap_or_else(|e| panic!("refused: {e}"));
    for (producer, expected) in [
        (
            json!({"eppTls": {"plaintext": true, "secretName": "picker-cert"}}),
            "plaintext and secretName exclude each other",
        ),
        (
            json!({"drainTimeoutMs": 3_600_001}),
            "spec.producer.drainTimeoutMs",
        ),
        (
            json!({"drainTimeoutMs": -1}),
            "spec.producer.drainTimeoutMs",
        ),
        (
            json!({"apiTls": {"secretName": "Not_A_Secret"}}),
            "spec.producer.apiTls.secretName",
        ),
        (
            json!({"apiTls": {}}),
            "spec.producer.apiTls.secretName: Required value",
        ),
    ] {
        let error = dry_run(producer.clone()).expect_err(&format!("{producer} accepted"));
        assert!(error.contains(expected), "{producer}: {error}");
    }
}

/// What the operator does with the API where it watches (crates/operator/src/controller.rs and
/// apply.rs): group, resource (`/subresource`), verbs. The chart must grant exactly these: each
/// verb listed, and none of the others. (Leases are checked apart: the chart's own one too.)
const OPERATOR_NEEDS: &[(&str, &str, &[&str])] = &[
    // get: the status of a policy whose spec this operator cannot read.
    (
        "burstprefix.io",
        "burstprefixpolicies",
        &["get", "list", "watch"],
    ),
    ("burstprefix.io", "burstprefixpolicies/status", &["patch"]),
    ("", "pods", &["list", "watch"]),
    (
        "inference.networking.k8s.io",
        "inferencepools",
        &["get", "list", "watch"],
    ),
    // get: the producer Role the operator creates grants get on its ConfigMap, and RBAC only
    // lets the operator grant what it holds.
    (
        "",
        "configmaps",
        &["get", "list", "watch", "create", "patch"],
    ),
    ("", "services", &["list", "watch", "create", "patch"]),
    ("", "serviceaccounts", &["list", "watch", "create", "patch"]),
    (
        "apps",
        "deployments",
        &["get", "list", "watch", "create", "patch"],
    ),
    (
        "rbac.authorization.k8s.io",
        "roles",
        &["list", "watch", "create", "patch"],
    ),
    (
        "rbac.authorization.k8s.io",
        "rolebindings",
        &["list", "watch", "create", "patch"],
    ),
    // delete: the budget of a policy back to one producer replica.
    (
        "policy",
        "poddisruptionbudgets",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // delete: a producer's NetworkPolicy once producer.networkPolicy is turned off.
    (
        "networking.k8s.io",
        "networkpolicies",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// What the operator does with Leases where it watches: creates each producer Lease (and
/// deletes it back at one replica), and holds get and patch because the producer Role grants
/// them. Never list or watch.
const PRODUCER_LEASE_VERBS: &[&str] = &["get", "create", "patch", "delete"];

const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// Things the operator never does: denied everywhere.
const NEVER: &[(&str, &str, &str)] = &[
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "pods/exec", "create"),
    ("", "pods/status", "patch"),
    ("", "namespaces", "list"),
    ("", "nodes", "list"),
    ("", "events", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("coordination.k8s.io", "leases", "list"),
];

/// Asks the API server, as the holder of `client`'s token, whether it may do this.
async fn may(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_string())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                namespace: namespace.map(Into::into),
                name: name.map(Into::into),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

/// Where an install's operator may act.
struct Scope<'a> {
    /// The release namespace (the leader Lease's).
    release_namespace: &'a str,
    /// A namespace the operator watches.
    watched: &'a str,
    /// A namespace it must not touch (none for a cluster-wide install).
    unwatched: Option<&'a str>,
    cluster_wide: bool,
    lease: Option<&'a str>,
}

/// One access check: `verb` on `group/resource` (`name`) in `namespace` (`None`: all of them),
/// and whether the operator needs it.
struct Check<'a> {
    need: bool,
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

/// Every permission the chart grants or withholds, as the chart's ServiceAccount sees it, that
/// differs from what the operator needs: empty when the chart grants exactly that.
async fn rbac_mismatches(client: &Client, scope: &Scope<'_>) -> Vec<String> {
    let mut checks = Vec::new();
    let mut check = |need, verb, group, resource, namespace, name| {
        checks.push(Check {
            need,
            verb,
            group,
            resource,
            namespace,
            name,
        })
    };
    for (group, resource, needed) in OPERATOR_NEEDS {
        for verb in VERBS {
            let need = needed.contains(verb);
            check(need, verb, group, resource, Some(scope.watched), None);
            if let Some(unwatched) = scope.unwatched {
                check(false, verb, group, resource, Some(unwatched), None);
            }
            // The watches of a cluster-wide operator are across all namespaces.
            if matches!(*verb, "list" | "watch") {
                check(
                    need && scope.cluster_wide,
                    verb,
                    group,
                    resource,
                    None,
                    None,
                );
            }
        }
    }
    for (group, resource, verb) in NEVER {
        check(false, verb, group, resource, Some(scope.watched), None);
        check(false, verb, group, resource, None, None);
    }
    // Leases. Where it watches: the producers' (any name). In the release namespace, unless it
    // is watched (cluster-wide): only the chart's leader Lease, get and patch.
    let leases = ("coordination.k8s.io", "leases");
    let release_ns = Some(scope.release_namespace);
    for verb in VERBS {
        let producer = PRODUCER_LEASE_VERBS.contains(verb);
        check(
            producer,
            verb,
            leases.0,
            leases.1,
            Some(scope.watched),
            Some("rl-producer"),
        );
        if let Some(lease) = scope.lease {
            let need = matches!(*verb, "get" | "patch") || (scope.cluster_wide && producer);
            check(need, verb, leases.0, leases.1, release_ns, Some(lease));
        }
        check(
            scope.cluster_wide && producer,
            verb,
            leases.0,
            leases.1,
            release_ns,
            Some("another-lease"),
        );
    }
    check(false, "list", leases.0, leases.1, Some(scope.watched), None);
    check(false, "watch", leases.0, leases.1, None, None);

    let answers = futures::future::join_all(
        checks
            .iter()
            .map(|c| may(client, c.verb, c.group, c.resource, c.namespace, c.name)),
    )
    .await;
    checks
        .iter()
        .zip(answers)
        .filter(|(c, allowed)| c.need != *allowed)
        .map(|(c, _)| {
            format!(
                "{} {} {}/{}{} in {}",
                if c.need {
                    "missing:"
                } else {
                    "granted but not needed:"
                },
                c.verb,
                c.group,
                c.resource,
                c.name.map(|n| format!(" {n}")).unwrap_or_default(),
                c.namespace.unwrap_or("all namespaces"),
            )
        })
        .collect()
}

/// The operator as the chart's Deployment runs it, out of cluster: the container's args and env
/// (the downward API resolved for a pod named `pod_name`), the admin port moved to a free local
/// one, and the token of the Deployment's ServiceAccount. Returns the process and that token.
async fn start_chart_operator(
    control_plane: &ControlPlane,
    release: &str,
    release_namespace: &str,
    pod_name: &str,
) -> (Process, String) {
    let client = control_plane.client();
    let deployments = Api::<Deployment>::namespaced(client.clone(), release_namespace)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .unwrap();
    assert_eq!(deployments.items.len(), 1, "the chart has one Deployment");
    let pod = deployments.items[0].spec.clone().template.spec.unwrap();
    let account = pod.service_account_name.clone().unwrap();
    // The chart made the ServiceAccount (service_account_token would create a missing one).
    let made = Api::<ServiceAccount>::namespaced(client.clone(), release_namespace)
        .get(&account)
        .await
        .unwrap_or_else(|e| panic!("the chart's ServiceAccount {account}: {e}"));
    assert_eq!(
        made.metadata.labels.unwrap()["app.kubernetes.io/managed-by"],
        "Helm"
    );
    let token = control_plane
        .service_account_token(release_namespace, &account)
        .await
        .unwrap();
    let kubeconfig = control_plane.kubeconfig_for(&account, &token).unwrap();

    let container = &pod.containers[0];
    let admin = format!("--admin-listen=127.0.0.1:{}", free_port());
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap()
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--admin-listen=") {
                admin.clone()
            } else {
                arg
            }
        })
        .collect();
    let mut command = Command::new(binary("burst-prefix-operator"));
    // Only what the pod would have: no admin kubeconfig, no RUST_LOG from the test's environment.
    command
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .args(&args);
    for var in container.env.clone().unwrap_or_default() {
        let value = match var.value_from.and_then(|from| from.field_ref) {
            Some(field) => match field.field_path.as_str() {
                "metadata.name" => pod_name.to_string(),
                "metadata.namespace" => release_namespace.to_string(),
                other => panic!("the test does not resolve fieldRef {other}"),
            },
            None => var.value.unwrap_or_default(),
        };
        command.env(var.name, value);
    }
    let operator = Process::spawn("chart-operator", &mut command, control_plane.dir());
    (operator, token)
}

/// Polls `check` like [`eventually`], but fails at once, with the lines that say so, when the
/// operator is refused something (a permission the chart lacks), and with its log on timeout.
async fn until_or_refused<T, F, Fut>(operator: &Process, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        let log = operator.log_text();
        let refused: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
        assert!(
            refused.is_empty(),
            "waiting for {what}, the operator was refused:\n{}",
            refused.join("\n")
        );
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}; operator log:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A policy and a ready pod in `namespace` become the producer's ConfigMap and the policy's
/// status: the operator's whole write path (children and status) under the chart's RBAC.
async fn policy_reaches_the_configmap(client: &Client, namespace: &str, operator: &Process) {
    create_policy(client, namespace, "rl", vllm_policy(json!({}))).await;
    create_pod(client, namespace, "vllm-0", "vllm").await;
    set_pod_status(client, namespace, "vllm-0", "10.2.0.1", true).await;
    let expected = format!("{namespace}/vllm-0-rank-0");
    until_or_refused(
        operator,
        "the endpoint in the producer's ConfigMap",
        || async {
            let config = producer_config(client, namespace, "rl-producer").await?;
            let ids: Vec<_> = config.endpoints.iter().map(|e| e.id.clone()).collect();
            (ids == [expected.clone()] && config.endpoints[0].address == "10.2.0.1:8000")
                .then_some(())
        },
    )
    .await;
    until_or_refused(
        operator,
        "EndpointsDiscovered=True in the status",
        || async {
            condition(client, namespace, "rl", "EndpointsDiscovered")
                .await
                .filter(|c| c.0 == "True")
        },
    )
    .await;
    for child in [
        "deployments/rl-producer",
        "services/rl-producer",
        "serviceaccounts/rl-producer",
        "roles.rbac.authorization.k8s.io/rl-producer",
        "rolebindings.rbac.authorization.k8s.io/rl-producer",
    ] {
        assert!(
            exists(client, namespace, child).await,
            "{child} was not applied; operator log:\n{}",
            operator.log_text()
        );
    }
    let log = operator.log_text();
    assert!(!log.contains("forbidden"), "operator log:\n{log}");
}

async fn exists(client: &Client, namespace: &str, object: &str) -> bool {
    let (kind, name) = object.split_once('/').unwrap();
    match kind {
        "deployments" => Api::<Deployment>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .unwrap()
            .is_some(),
        "services" => {
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
        }
        "serviceaccounts" => Api::<ServiceAccount>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .unwrap()
            .is_some(),
        "roles.rbac.authorization.k8s.io" => {
            Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
        }
        "rolebindings.rbac.authorization.k8s.io" => {
            Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .unwrap()
                .is_some()
        }
        other => panic!("exists: {other}"),
    }
}

fn helm_install(control_plane: &ControlPlane, release: &str, namespace: &str, values: &[&str]) {
    let mut install = control_plane.helm();
    install
        .args(["install", release, "--namespace", namespace])
        .arg(chart())
        .args(values);
    let output = run(&mut install, None).unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(output.contains("kubectl get bpp"), "NOTES.txt: {output}");
}

/// Everything left labelled with the release, in any namespace and of any kind the API serves.
fn labelled_with_release(control_plane: &ControlPlane, release: &str) -> Vec<String> {
    let kinds = run(
        control_plane
            .kubectl()
            .args(["api-resources", "--verbs=list", "-o", "name"]),
        None,
    )
    .unwrap();
    let kinds: Vec<&str> = kinds.lines().filter(|k| !k.is_empty()).collect();
    let left = run(
        control_plane.kubectl().args([
            "get",
            &kinds.join(","),
            "--all-namespaces",
            "--ignore-not-found",
            "-o",
            "name",
            "-l",
            &format!("app.kubernetes.io/instance={release}"),
        ]),
        None,
    )
    .unwrap();
    left.lines().map(str::to_string).collect()
}

/// `helm uninstall` leaves nothing labelled with the release, and no release record; the CRD
/// stays (helm never deletes CRDs: the chart README says how to remove it).
async fn uninstall_leaves_only_the_crd(
    control_plane: &ControlPlane,
    release: &str,
    namespace: &str,
) {
    assert!(!labelled_with_release(control_plane, release).is_empty());
    run(
        control_plane
            .helm()
            .args(["uninstall", release, "--namespace", namespace]),
        None,
    )
    .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    assert_eq!(
        labelled_with_release(control_plane, release),
        Vec::<String>::new()
    );
    let records = run(
        control_plane.kubectl().args([
            "get",
            "secrets",
            "--namespace",
            namespace,
            "-o",
            "name",
            "-l",
            &format!("owner=helm,name={release}"),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(records.trim(), "", "helm's release records");
    run(
        control_plane
            .kubectl()
            .args(["get", "crd", "burstprefixpolicies.burstprefix.io"]),
        None,
    )
    .expect("the CRD stays after helm uninstall");
}

/// The user deletes their policies. In a real cluster the garbage collector then deletes each
/// policy's children (they have a controller ownerReference to it); no kube-controller-manager
/// runs here, so they stay: check that each is owned by a policy that is gone, i.e. that the
/// collector would take it, rather than expecting it to be gone.
async fn delete_policies_children_are_collectable(client: &Client, namespace: &str) {
    let policies = Api::<BurstPrefixPolicy>::namespaced(client.clone(), namespace);
    policies
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    eventually("the policies to be gone", TIMEOUT, || async {
        policies
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let config_maps =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
            .list(
                &ListParams::default().labels("app.kubernetes.io/managed-by=burst-prefix-operator"),
            )
            .await
            .unwrap();
    assert!(!config_maps.items.is_empty());
    for child in config_maps.items {
        let owners = child.metadata.owner_references.unwrap_or_default();
        assert!(
            owners
                .iter()
                .any(|o| o.kind == "BurstPrefixPolicy" && o.controller == Some(true)),
            "{:?} has no policy owner: the garbage collector would leave it",
            child.metadata.name
        );
    }
}

/// The default install (all namespaces) with two replicas, so leader election too: the real
/// operator with the chart's ServiceAccount reconciles a policy, the chart grants exactly what
/// the operator needs, and a permission taken away shows in the flow.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_wide_install_runs_the_operator_with_the_chart_rbac_then_uninstalls() {
    let _one_operator = OPERATOR.lock().await;
    let control_plane = ControlPlane::shared();
    let client = control_plane.client();
    let release = "burst-prefix-cw";
    let release_ns = control_plane.namespace("chart-cw").await.unwrap();
    let app_ns = control_plane.namespace("chart-cw-ml").await.unwrap();
    install_crd(control_plane);
    helm_install(
        control_plane,
        release,
        &release_ns,
        &["--set", "replicas=2", "--set", "crds.install=false"],
    );
    let pod_name = format!("{release}-test-0");
    let (operator, token) =
        start_chart_operator(control_plane, release, &release_ns, &pod_name).await;

    // It leads with the chart's Lease (it has no create on leases: the chart made it).
    let leases = Api::<Lease>::namespaced(client.clone(), &release_ns);
    eventually(
        "the operator to hold the chart's Lease",
        TIMEOUT,
        || async {
            let holder = leases.get(release).await.ok()?.spec?.holder_identity?;
            (holder == pod_name).then_some(())
        },
    )
    .await;
    policy_reaches_the_configmap(&client, &app_ns, &operator).await;
    assert!(
        producer_network_policy(&client, &app_ns, "rl-producer")
            .await
            .is_none(),
        "producer.networkPolicy is off by default"
    );

    let scope = Scope {
        release_namespace: &release_ns,
        watched: &app_ns,
        unwatched: None,
        cluster_wide: true,
        lease: Some(release),
    };
    let mismatches = rbac_mismatches(&control_plane.client_for(&token), &scope).await;
    assert!(
        mismatches.is_empty(),
        "the chart's RBAC:\n{}",
        mismatches.join("\n")
    );

    // One verb fewer fails the flow: without create on configmaps a new policy gets no ConfigMap
    // and the operator logs the refusal; with the chart's rule back, it gets one.
    let original = run(
        control_plane.kubectl().args([
            "get",
            "clusterrole",
            &format!("{release}-write"),
            "-o",
            "json",
        ]),
        None,
    )
    .unwrap();
    let mut role: Value = serde_json::from_str(&original).unwrap();
    role["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let restored = role.clone();
    for rule in role["rules"].as_array_mut().unwrap() {
        if strings(&rule["resources"]).contains(&"configmaps") {
            rule["verbs"]
                .as_array_mut()
                .unwrap()
                .retain(|verb| verb != "create");
        }
    }
    let replace = |role: &Value| {
        run(
            control_plane.kubectl().args(["replace", "-f", "-"]),
            Some(&role.to_string()),
        )
        .unwrap()
    };
    replace(&role);
    let denied = rbac_mismatches(&control_plane.client_for(&token), &scope).await;
    assert!(
        denied
            .iter()
            .any(|m| m.starts_with("missing: create /configmaps")),
        "{denied:?}"
    );
    create_policy(&client, &app_ns, "denied", vllm_policy(json!({}))).await;
    eventually(
        "the operator to be refused the ConfigMap",
        TIMEOUT,
        || async {
            let log = operator.log_text();
            (log.contains("denied-producer") && log.contains("forbidden")).then_some(())
        },
    )
    .await;
    assert!(producer_config(&client, &app_ns, "denied-producer")
        .await
        .is_none());
    replace(&restored);
    eventually("the ConfigMap once the rule is back", TIMEOUT, || async {
        producer_config(&client, &app_ns, "denied-producer").await
    })
    .await;

    drop(operator);
    delete_policies_children_are_collectable(&client, &app_ns).await;
    uninstall_leaves_only_the_crd(control_plane, release, &release_ns).await;
}

/// An install that watches one namespace: Role and RoleBinding there, nothing cluster-wide, and
/// the operator reconciles with just that.
#[tokio::test(flavor = "multi_thread")]
async fn one_namespace_install_runs_the_operator_with_the_chart_rbac_then_uninstalls() {
    let _one_operator = OPERATOR.lock().await;
    let control_plane = ControlPlane::shared();
    let client = control_plane.client();
    let release = "burst-prefix-ns";
    let release_ns = control_plane.namespace("chart-ns").await.unwrap();
    let app_ns = control_plane.namespace("chart-ns-ml").await.unwrap();
    let other_ns = control_plane.namespace("chart-ns-other").await.unwrap();
    let watch = format!("watchNamespaces={{{app_ns}}}");
    install_crd(control_plane);
    // With a NetworkPolicy per producer: the gateway's namespace may reach the endpoint
    // picker, nobody the admin port, the default (the policy's namespace) the API.
    helm_install(
        control_plane,
        release,
        &release_ns,
        &[
            "--set",
            &watch,
            "--set",
            "crds.install=false",
            "--set",
            "producer.networkPolicy.enabled=true",
            "--set-json",
            GATEWAY_PEERS,
            "--set-json",
            "producer.networkPolicy.admin=[]",
        ],
    );
    let (operator, token) = start_chart_operator(
        control_plane,
        release,
        &release_ns,
        "burst-prefix-ns-test-0",
    )
    .await;
    policy_reaches_the_configmap(&client, &app_ns, &operator).await;
    let network_policy = until_or_refused(&operator, "the producer's NetworkPolicy", || {
        producer_network_policy(&client, &app_ns, "rl-producer")
    })
    .await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &app_ns)
        .get("rl-producer")
        .await
        .unwrap();
    let spec = network_policy.spec.unwrap();
    assert_eq!(
        spec.pod_selector,
        Some(deployment.spec.selector),
        "it selects the producer pods, as the Deployment does"
    );
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = serde_json::to_value(spec.ingress.unwrap()).unwrap();
    assert_eq!(
        rules,
        json!([
            {"ports": [{"port": 8080, "protocol": "TCP"}], "from": [{"podSelector": {}}]},
            {"ports": [{"port": 9002, "protocol": "TCP"}],
             "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}]},
        ]),
        "the API open to the policy's namespace, the picker to the gateways, the admin port closed"
    );

    let scope = Scope {
        release_namespace: &release_ns,
        watched: &app_ns,
        unwatched: Some(&other_ns),
        cluster_wide: false,
        lease: None,
    };
    let mismatches = rbac_mismatches(&control_plane.client_for(&token), &scope).await;
    assert!(
        mismatches.is_empty(),
        "the chart's RBAC:\n{}",
        mismatches.join("\n")
    );

    // producer.networkPolicy turned off: the operator the upgraded chart runs deletes it.
    drop(operator);
    let mut upgrade = control_plane.helm();
    upgrade
        .args([
            "upgrade",
            release,
            "--namespace",
            &release_ns,
            "--reuse-values",
        ])
        .arg(chart())
        .args(["--set", "producer.networkPolicy.enabled=false"]);
    run(&mut upgrade, None).unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    let (operator, _) = start_chart_operator(
        control_plane,
        release,
        &release_ns,
        "burst-prefix-ns-test-1",
    )
    .await;
    until_or_refused(&operator, "the NetworkPolicy to be deleted", || async {
        producer_network_policy(&client, &app_ns, "rl-producer")
            .await
            .is_none()
            .then_some(())
    })
    .await;

    drop(operator);
    delete_policies_children_are_collectable(&client, &app_ns).await;
    uninstall_leaves_only_the_crd(control_plane, release, &release_ns).await;
}

/// `producer.networkPolicy.endpointPicker`: the pods of the namespace `gateways`.
const GATEWAY_PEERS: &str = r#"producer.networkPolicy.endpointPicker=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"gateways"}}}]"#;

async fn producer_network_policy(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Option<NetworkPolicy> {
    Api::<NetworkPolicy>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}
