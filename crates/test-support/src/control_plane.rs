//! A real control plane: etcd plus kube-apiserver on 127.0.0.1, in a temp directory.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

use crate::binaries::Binaries;
use crate::process::{self, ScratchDir};
use crate::tokens::{self, TokenUser};
use crate::{certs, kubeconfig, Error};

/// How long etcd plus kube-apiserver may take to report ready (a cold start is ~5-15 s here).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a stopping kube-apiserver or etcd gets before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Attempts with fresh ports when a process exits during startup (another process took a port).
const START_ATTEMPTS: usize = 3;
const LOG_TAIL_LINES: usize = 40;

/// The Service IP range; its first address is the `kubernetes` Service's ClusterIP.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";
/// The `kubernetes` Service's ClusterIP: the first address of [`SERVICE_CLUSTER_IP_RANGE`].
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// What to set up before start.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra static-token users, on top of [`ControlPlane::admin`] and [`ControlPlane::user`]
    /// (kube-apiserver reads its token file only at start).
    pub users: Vec<TokenUser>,
    /// Serve pods as well (see [`InCluster`]); `None`: 127.0.0.1 only, for tests without a node.
    pub in_cluster: Option<InCluster>,
}

/// A control plane for a node's pods (crate::Node): in-cluster clients reach kube-apiserver
/// through the `kubernetes` Service, so it listens on every address of the test's own network
/// namespace, advertises `advertise_address` as that Service's endpoint, has the Service's names
/// and ClusterIP in its certificate, and admits pods the way a cluster does (ServiceAccount token
/// volumes; kubelets restricted to their own node).
#[derive(Debug, Clone)]
pub struct InCluster {
    /// The node's address, where kube-proxy sends the `kubernetes` Service's traffic.
    pub advertise_address: Ipv4Addr,
}

/// etcd and kube-apiserver, running until this value is dropped or the process ends.
///
/// No kube-controller-manager, scheduler or kubelet runs: objects are stored, validated,
/// admitted and watched for real, but nothing acts on them (no pods start, no garbage collection
/// of owned objects, no "default" ServiceAccount, deleted namespaces stay Terminating).
///
/// Clients are made per call ([`Self::client`]) in the caller's Tokio runtime, so the control
/// plane is not tied to the runtime of the test that started it.
#[derive(Debug)]
pub struct ControlPlane {
    binaries: Binaries,
    server: String,
    ca_cert_der: Vec<u8>,
    ca_file: PathBuf,
    admin: TokenUser,
    user: TokenUser,
    admin_kubeconfig: PathBuf,
    etcd: Mutex<Child>,
    apiserver: Mutex<Child>,
    apiserver_args: Vec<OsString>,
    etcd_log: PathBuf,
    apiserver_log: PathBuf,
    counter: AtomicU64,
    // Last: dropped after the processes are stopped.
    dir: ScratchDir,
}

impl ControlPlane {
    /// The control plane shared by every test of this test binary, started on first use.
    ///
    /// Panics, with what to do, when the binaries are missing (`make control-plane`) or the
    /// control plane does not start (with the tail of the etcd and kube-apiserver logs).
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| match Self::start(Options::default()) {
            Ok(control_plane) => control_plane,
            Err(err) => panic!("starting the test control plane failed: {err}"),
        })
    }

    /// Starts a control plane of its own (most tests want [`Self::shared`]). Blocks until
    /// kube-apiserver is ready; may be called from inside or outside a Tokio runtime.
    pub fn start(options: Options) -> Result<Self, Error> {
        let binaries = Binaries::locate()?;
        let mut attempt = 1;
        loop {
            match Self::start_once(&binaries, &options) {
                Err(Error::NotReady { exited: true, .. }) if attempt < START_ATTEMPTS => {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once(binaries: &Binaries, options: &Options) -> Result<Self, Error> {
        let dir = ScratchDir::create("burst-prefix-control-plane-")
            .map_err(|e| Error::io("creating the control plane's temp directory", e))?;
        let path = |name: &str| dir.path().join(name);

        let (extra_ips, extra_names): (Vec<IpAddr>, &[&str]) = match &options.in_cluster {
            Some(in_cluster) => (
                vec![
                    IpAddr::V4(in_cluster.advertise_address),
                    IpAddr::V4(KUBERNETES_SERVICE_IP),
                ],
                &[
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
            ),
            None => (Vec::new(), &[]),
        };
        let pki = certs::generate(&extra_ips, extra_names)?;
        let ca_file = path("ca.crt");
        write(&ca_file, &pki.ca_cert_pem)?;
        write(&path("apiserver.crt"), &pki.serving_cert_pem)?;
        write(&path("apiserver.key"), &pki.serving_key_pem)?;
        write(&path("service-account.key"), &pki.service_account_key_pem)?;
        write(
            &path("service-account.pub"),
            &pki.service_account_public_pem,
        )?;

        let admin = TokenUser::new("burst-prefix-admin", &["system:masters"]);
        let user = TokenUser::new("burst-prefix-user", &[]);
        let token_file: String = [&admin, &user]
            .into_iter()
            .chain(&options.users)
            .map(TokenUser::csv_line)
            .collect();
        write(&path("tokens.csv"), &token_file)?;

        let [etcd_client_port, etcd_peer_port, apiserver_port] = free_ports()?;
        let etcd_client = format!("http://127.0.0.1:{etcd_client_port}");
        let etcd_peer = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd_args: Vec<OsString> = vec![
            "--name=default".into(),
            flag("--data-dir", path("etcd")),
            flag("--listen-client-urls", &etcd_client),
            flag("--advertise-client-urls", &etcd_client),
            flag("--listen-peer-urls", &etcd_peer),
            flag("--initial-advertise-peer-urls", &etcd_peer),
            flag("--initial-cluster", format!("default={etcd_peer}")),
            // Test data: durability does not matter, speed does.
            "--unsafe-no-fsync".into(),
        ];
        let mut apiserver_args: Vec<OsString> = vec![
            flag("--etcd-servers", &etcd_client),
            flag("--secure-port", apiserver_port.to_string()),
            flag("--cert-dir", path("apiserver-certs")),
            flag("--tls-cert-file", path("apiserver.crt")),
            flag("--tls-private-key-file", path("apiserver.key")),
            flag("--token-auth-file", path("tokens.csv")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            flag("--service-account-key-file", path("service-account.pub")),
            flag(
                "--service-account-signing-key-file",
                path("service-account.key"),
            ),
            flag("--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE),
            "--allow-privileged=true".into(),
        ];
        match &options.in_cluster {
            None => apiserver_args.extend([
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                "--authorization-mode=RBAC".into(),
                // Without kube-controller-manager no "default" ServiceAccount is ever created, and
                // the ServiceAccount admission plugin would refuse every pod.
                "--disable-admission-plugins=ServiceAccount".into(),
                // Nothing listens at the advertise address for in-cluster clients: no endpoints.
                "--endpoint-reconciler-type=none".into(),
            ]),
            Some(in_cluster) => apiserver_args.extend([
                // Every address of the test's own network namespace (see crate::node).
                "--bind-address=0.0.0.0".into(),
                flag(
                    "--advertise-address",
                    in_cluster.advertise_address.to_string(),
                ),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                // The node's name resolves nowhere (no DNS in the test's network): its address.
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]),
        }

        let etcd_log = path("etcd.log");
        let apiserver_log = path("kube-apiserver.log");
        let mut etcd_command = Command::new(binaries.get("etcd")?);
        etcd_command.args(&etcd_args).current_dir(dir.path());
        let mut etcd = process::spawn_supervised(etcd_command, &etcd_log)
            .map_err(|e| Error::io("starting etcd", e))?;
        let apiserver = match spawn_apiserver(binaries, &apiserver_args, dir.path(), &apiserver_log)
        {
            Ok(apiserver) => apiserver,
            Err(err) => {
                // `etcd` is not in a ControlPlane yet: stop it here.
                process::stop(&mut etcd, STOP_GRACE);
                return Err(err);
            }
        };

        let server = format!("https://127.0.0.1:{apiserver_port}");
        let admin_kubeconfig = path("kubeconfig-admin.yaml");
        write(
            &admin_kubeconfig,
            &kubeconfig::kubeconfig_yaml(&server, &ca_file, &admin.name, &admin.token),
        )?;

        let control_plane = Self {
            binaries: binaries.clone(),
            server,
            ca_cert_der: pki.ca_cert_der,
            ca_file,
            admin,
            user,
            admin_kubeconfig,
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(apiserver),
            apiserver_args,
            etcd_log,
            apiserver_log,
            counter: AtomicU64::new(0),
            dir,
        };
        // On failure `control_plane` is dropped: both processes stop and the directory goes.
        block_on_own_runtime(control_plane.wait_ready())?;
        Ok(control_plane)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The PEM file of the CA that signed kube-apiserver's serving certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The private key that signs service-account tokens (kube-controller-manager's
    /// `--service-account-private-key-file`).
    pub fn service_account_key_file(&self) -> PathBuf {
        self.dir.path().join("service-account.key")
    }

    /// The control plane's temp directory (logs, certificates, kubeconfigs, etcd data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The binaries it runs, and helm and kubectl.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A cluster admin: user `burst-prefix-admin` in group `system:masters`.
    pub fn admin(&self) -> &TokenUser {
        &self.admin
    }

    /// An authenticated user with no RBAC bindings: user `burst-prefix-user`, no groups.
    pub fn user(&self) -> &TokenUser {
        &self.user
    }

    /// An admin client. Call it inside the Tokio runtime that will use it (a kube client runs
    /// tasks on the runtime it was created in).
    pub fn client(&self) -> kube::Client {
        self.client_for(&self.admin.token)
    }

    /// A client that authenticates with `token`: a static token from [`Options::users`] or
    /// [`Self::user`], or one from [`Self::service_account_token`].
    pub fn client_for(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.config_for(token)).expect("a kube client for the control plane")
    }

    /// The kube-rs config behind [`Self::client_for`].
    pub fn config_for(&self, token: &str) -> kube::Config {
        kubeconfig::kube_config(&self.server, &self.ca_cert_der, token)
    }

    /// The admin kubeconfig file (for kubectl, helm, or a binary under test via `KUBECONFIG`).
    pub fn kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Writes a kubeconfig file for `token`, named after `user` in the file.
    pub fn kubeconfig_for(&self, user: &str, token: &str) -> Result<PathBuf, Error> {
        let file = self
            .dir()
            .join(format!("kubeconfig-{}.yaml", self.next_id()));
        write(
            &file,
            &kubeconfig::kubeconfig_yaml(&self.server, &self.ca_file, user, token),
        )?;
        Ok(file)
    }

    /// Creates a namespace named `<prefix>-<n>-<random>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, kube::Error> {
        let name = namespace_name(prefix, self.next_id(), &tokens::random_hex(2));
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("burst-prefix.test/namespace".into(), "true".into())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &namespace)
            .await?;
        Ok(name)
    }

    /// A real, signed token for ServiceAccount `namespace/name` (created if missing), valid for an
    /// hour: it authenticates as `system:serviceaccount:<namespace>:<name>`.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, kube::Error> {
        let accounts = Api::<ServiceAccount>::namespaced(self.client(), namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(err) => return Err(err),
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let issued = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await?;
        Ok(issued
            .status
            .and_then(|status| status.token)
            .expect("an issued TokenRequest carries a token"))
    }

    /// Stops kube-apiserver and starts it again on the same port, with the same etcd (so all
    /// objects survive), and waits until it is ready. Other tests of the same binary see the API
    /// go away meanwhile: keep tests that restart in a test binary of their own.
    pub async fn restart_apiserver(&self) -> Result<(), Error> {
        {
            let mut apiserver = self.lock_apiserver();
            process::stop(&mut apiserver, STOP_GRACE);
            *apiserver = spawn_apiserver(
                &self.binaries,
                &self.apiserver_args,
                self.dir.path(),
                &self.apiserver_log,
            )?;
        }
        self.wait_ready().await
    }

    /// The last lines of the etcd and kube-apiserver logs, for a failing test's message.
    pub fn logs_tail(&self, lines: usize) -> String {
        format!(
            "{}\n{}",
            process::log_tail(&self.etcd_log, lines),
            process::log_tail(&self.apiserver_log, lines)
        )
    }

    /// A `kubectl` command with `KUBECONFIG` set to the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.tool("kubectl"));
        command.env("KUBECONFIG", &self.admin_kubeconfig);
        command
    }

    /// A `helm` command with `KUBECONFIG` set to the admin kubeconfig and helm's cache, config and
    /// data directories inside the control plane's temp directory.
    pub fn helm(&self) -> Command {
        let mut command = Command::new(self.tool("helm"));
        command.env("KUBECONFIG", &self.admin_kubeconfig);
        for (var, sub) in [
            ("HELM_CACHE_HOME", "helm/cache"),
            ("HELM_CONFIG_HOME", "helm/config"),
            ("HELM_DATA_HOME", "helm/data"),
        ] {
            command.env(var, self.dir().join(sub));
        }
        command
    }

    fn tool(&self, name: &str) -> PathBuf {
        match self.binaries.get(name) {
            Ok(path) => path,
            Err(err) => panic!("{err}"),
        }
    }

    fn next_id(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock_apiserver(&self) -> MutexGuard<'_, Child> {
        self.apiserver.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_etcd(&self) -> MutexGuard<'_, Child> {
        self.etcd.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Polls `/readyz` until it answers `ok`; fails early when etcd or kube-apiserver exits.
    async fn wait_ready(&self) -> Result<(), Error> {
        let client = self.client();
        let start = Instant::now();
        loop {
            for (what, mut child) in [
                ("etcd", self.lock_etcd()),
                ("kube-apiserver", self.lock_apiserver()),
            ] {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(self.not_ready(true, format!("{what} exited ({status})")));
                }
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a GET request builds");
            let last_error =
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
                    .await
                {
                    Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                    Ok(Ok(body)) => format!("/readyz said {body:?}"),
                    Ok(Err(err)) => format!("/readyz: {err}"),
                    Err(_) => "/readyz did not answer within 5s".to_owned(),
                };
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.not_ready(
                    false,
                    format!("not ready after {READY_TIMEOUT:?}; last: {last_error}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn not_ready(&self, exited: bool, reason: String) -> Error {
        Error::NotReady {
            exited,
            reason,
            logs: self.logs_tail(LOG_TAIL_LINES),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        process::stop(&mut self.lock_apiserver(), STOP_GRACE);
        process::stop(&mut self.lock_etcd(), STOP_GRACE);
    }
}

fn spawn_apiserver(
    binaries: &Binaries,
    args: &[OsString],
    dir: &Path,
    log: &Path,
) -> Result<Child, Error> {
    let mut command = Command::new(binaries.get("kube-apiserver")?);
    command.args(args).current_dir(dir);
    process::spawn_supervised(command, log).map_err(|e| Error::io("starting kube-apiserver", e))
}

/// Runs a future to completion on a runtime of its own, on a thread of its own, so that a
/// caller inside a Tokio runtime does not nest runtimes.
pub(crate) fn block_on_own_runtime<T: Send>(
    future: impl std::future::Future<Output = T> + Send,
) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a Tokio runtime")
                    .block_on(future)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Three distinct free ports on 127.0.0.1 (held together while chosen, so they differ).
fn free_ports() -> Result<[u16; 3], Error> {
    let bind = || TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e));
    let listeners = [bind()?, bind()?, bind()?];
    let port = |l: &TcpListener| {
        l.local_addr()
            .map(|a| a.port())
            .map_err(|e| Error::io("finding a free port", e))
    };
    Ok([
        port(&listeners[0])?,
        port(&listeners[1])?,
        port(&listeners[2])?,
    ])
}

/// `<prefix>-<n>-<suffix>` as a DNS label: lowercase alphanumerics and '-', at most 63 chars.
fn namespace_name(prefix: &str, n: u64, suffix: &str) -> String {
    let tail = format!("-{n}-{suffix}");
    let mut head: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63 - tail.len())
        .collect();
    head = head.trim_matches('-').to_owned();
    if head.is_empty() {
        head.push_str("test");
    }
    head + &tail
}

pub(crate) fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> OsString {
    let mut flag = OsString::from(name);
    flag.push("=");
    flag.push(value);
    flag
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        assert_eq!(namespace_name("Smoke Test", 3, "ab12"), "smoke-test-3-ab12");
        assert_eq!(namespace_name("--", 1, "ff"), "test-1-ff");
        let long = namespace_name(&"x".repeat(100), 12, "abcd");
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("-12-abcd"));
    }

    #[test]
    fn ports_differ() {
        let [a, b, c] = free_ports().unwrap();
        assert!(a != b && b != c && a != c);
    }
}
