//! Helpers shared by the integration tests: the project's binaries as child processes, and
//! waiting for a condition with a deadline.

#![allow(dead_code)] // each test binary uses its own subset

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_api::ProducerConfig;
use burst_prefix_test_support::ControlPlane;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of this workspace, built by `cargo test --workspace` (which `make test` runs) next
/// to the test executables.
pub fn binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("test executable path");
    let path = deps
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make test` (or `cargo build --workspace --bins` first)",
        path.display()
    );
    path
}

/// A child process killed (and reaped) on drop, even when the test panics; its output goes to a
/// log file whose tail a failing test can print.
pub struct Process {
    child: Child,
    pub log: PathBuf,
    name: String,
}

impl Process {
    pub fn spawn(name: &str, command: &mut Command, log_dir: &Path) -> Process {
        let log = log_dir.join(format!(
            "{name}-{}.log",
            std::process::id() as u64 ^ rand_suffix()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process {
            child,
            log,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Has it exited? With which code?
    pub fn exit_code(&mut self) -> Option<Option<i32>> {
        self.child.try_wait().ok().flatten().map(|s| s.code())
    }

    pub fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
    }

    /// Waits for the process to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(code) = self.exit_code() {
                return code;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{} did not exit within {timeout:?}; log:\n{}",
            self.name,
            self.log_text()
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A failing test shows what the process said.
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- last lines of {} ({}) ---",
                self.name,
                self.log.display()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The prologue of a test against the control plane: the shared control plane with the project's
/// CRD installed (once per test binary), a client, and a namespace of the test's own.
pub struct Scene {
    pub control_plane: &'static ControlPlane,
    pub client: Client,
    pub ns: String,
}

impl Scene {
    pub async fn new(namespace_prefix: &str) -> Scene {
        static CRD: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        let control_plane = ControlPlane::shared();
        CRD.get_or_init(|| install_crd(control_plane));
        Scene {
            control_plane,
            client: control_plane.client(),
            ns: control_plane.namespace(namespace_prefix).await.unwrap(),
        }
    }
}

/// A policy spec that selects the `app=vllm` pods on port 8000, with `extra` spec fields.
pub fn vllm_policy(extra: Value) -> Value {
    let mut spec =
        json!({"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

/// Applies the project's CRD with kubectl, as a user would, and waits until it is served.
pub fn install_crd(control_plane: &ControlPlane) {
    let output = control_plane
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(repo().join("crds/burstprefixpolicies.yaml"))
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl apply CRD: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = control_plane
        .kubectl()
        .args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/burstprefixpolicies.burstprefix.io",
        ])
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "CRD not established: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start_operator(control_plane: &ControlPlane, namespace: &str, extra: &[&str]) -> Process {
    let mut command = Command::new(binary("burst-prefix-operator"));
    command
        .env("KUBECONFIG", control_plane.kubeconfig())
        .args(["run", "--watch-namespace", namespace])
        .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
        .args(extra);
    Process::spawn("operator", &mut command, control_plane.dir())
}

pub async fn create_policy(client: &Client, namespace: &str, name: &str, spec: Value) {
    let policy: BurstPrefixPolicy = serde_json::from_value(json!({
        "apiVersion": "burstprefix.io/v1alpha1",
        "kind": "BurstPrefixPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    Api::<BurstPrefixPolicy>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
}

pub async fn create_pod(client: &Client, namespace: &str, name: &str, app: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Stands in for the kubelet: sets the pod's IP and its Ready condition.
pub async fn set_pod_status(client: &Client, namespace: &str, name: &str, ip: &str, ready: bool) {
    let patch = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    }});
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

pub async fn producer_config(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Option<ProducerConfig> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()??;
    ProducerConfig::from_yaml(config_map.data?.get("config.yaml")?).ok()
}

pub async fn endpoint_ids(client: &Client, namespace: &str) -> Option<Vec<String>> {
    let config = producer_config(client, namespace, "rl-producer").await?;
    Some(config.endpoints.into_iter().map(|e| e.id).collect())
}

pub async fn condition(
    client: &Client,
    namespace: &str,
    policy: &str,
    type_: &str,
) -> Option<(String, String)> {
    let (status, reason, _) = condition_full(client, namespace, policy, type_).await?;
    Some((status, reason))
}

/// The real producer, out of cluster, watching ConfigMap `namespace/name` as ServiceAccount
/// `namespace/name` (whatever RBAC that account has is all it gets).
pub struct Producer {
    pub process: Process,
    pub api: String,
    pub admin: String,
}

pub async fn start_producer(control_plane: &ControlPlane, namespace: &str, name: &str) -> Producer {
    let token = control_plane
        .service_account_token(namespace, name)
        .await
        .unwrap();
    let kubeconfig = control_plane.kubeconfig_for(name, &token).unwrap();
    let (api_port, admin_port) = (free_port(), free_port());
    let mut command = Command::new(binary("burst-prefix-producer"));
    command
        .env("KUBECONFIG", &kubeconfig)
        .args(["serve", "--configmap", &format!("{namespace}/{name}")])
        .args(["--listen", &format!("127.0.0.1:{api_port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args(["--epp-listen", "127.0.0.1:0"]);
    Producer {
        process: Process::spawn("producer", &mut command, control_plane.dir()),
        api: format!("http://127.0.0.1:{api_port}"),
        admin: format!("http://127.0.0.1:{admin_port}"),
    }
}

/// The operator with its admin URL (`/readyz`, `/metrics`).
pub struct Operator {
    pub process: Process,
    pub admin: String,
}

/// Like [`start_operator`], as any kubeconfig (e.g. a ServiceAccount's), with its admin URL.
pub fn start_operator_as(
    control_plane: &ControlPlane,
    kubeconfig: &Path,
    namespace: &str,
    extra: &[&str],
) -> Operator {
    let port = free_port();
    let mut command = Command::new(binary("burst-prefix-operator"));
    command
        .env("KUBECONFIG", kubeconfig)
        .args(["run", "--watch-namespace", namespace])
        .args(["--admin-listen", &format!("127.0.0.1:{port}")])
        .args(extra);
    Operator {
        process: Process::spawn("operator", &mut command, control_plane.dir()),
        admin: format!("http://127.0.0.1:{port}"),
    }
}

/// `(status, reason, message)` of a policy's condition.
pub async fn condition_full(
    client: &Client,
    namespace: &str,
    policy: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    // Untyped: a policy whose spec does not deserialize (a CRD newer than the code) has a
    // status too.
    let policy = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::erase::<BurstPrefixPolicy>(&()),
    )
    .get(policy)
    .await
    .ok()?;
    let status: burst_prefix_api::policy::BurstPrefixPolicyStatus =
        serde_json::from_value(policy.data.get("status")?.clone()).ok()?;
    let condition = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((condition.status, condition.reason, condition.message))
}

/// The Events (events.k8s.io/v1) about policy `name` in `namespace`.
pub async fn policy_events(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("BurstPrefixPolicy") && r.name.as_deref() == Some(name)
            })
        })
        .collect()
}

/// The children of policy `policy` that exist (as `Kind/name`).
pub async fn children_of(client: &Client, namespace: &str, policy: &str) -> Vec<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Service, ServiceAccount};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let name = format!("{policy}-producer");
    let mut found = Vec::new();
    macro_rules! check {
        ($kind:ty, $label:expr) => {
            if Api::<$kind>::namespaced(client.clone(), namespace)
                .get_opt(&name)
                .await
                .unwrap()
                .is_some()
            {
                found.push(format!("{}/{name}", $label));
            }
        };
    }
    check!(ConfigMap, "ConfigMap");
    check!(ServiceAccount, "ServiceAccount");
    check!(Role, "Role");
    check!(RoleBinding, "RoleBinding");
    check!(Lease, "Lease");
    check!(Service, "Service");
    check!(PodDisruptionBudget, "PodDisruptionBudget");
    check!(Deployment, "Deployment");
    found
}

/// GET `url`: the status code and body, or `None` when nothing answers.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// A runtime for a test that drives processes from a plain `#[test]` (two workers).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One sample's value in the Prometheus text `metrics` (`name` with its labels as rendered,
/// e.g. `x_total{type="a"}`); 0 when absent.
pub fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}
