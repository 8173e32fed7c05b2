//! A real node that runs pods: containerd (CRI) with runc and the CNI bridge, kubelet,
//! kube-proxy (iptables), kube-scheduler and kube-controller-manager, beside a control plane of
//! its own, all inside network and mount namespaces that the test process made for itself.
//!
//! Isolation, so that a test node can never touch the machine's own network or mounts:
//! - [`enter_namespaces`] (first thing in the test's `main`) moves the whole test process into a
//!   new network namespace, with nothing but `lo` and the node's bridge: kube-apiserver, the
//!   pods and kube-proxy's iptables rules all live there, no route leads out of it, and it goes
//!   away with the last process in it. A new mount namespace keeps the kubelet's and containerd's
//!   mounts (volumes, container root filesystems, pod network namespaces) out of the machine's.
//! - Every pod, containerd and its shims run in cgroups of the node's own (cgroupfs driver,
//!   `cgroupRoot`), killed as a whole when the node stops, or by a watchdog when the test process
//!   dies without stopping it.
//!
//! Here the node itself; [`namespaces`] the isolation, [`cgroups`] the containment, [`host`] the
//! commands and files it runs on the host.
//!
//! The node is the bridge's address ([`NODE_IP`]); pods get addresses of [`POD_CIDR`] on the
//! bridge, Services ClusterIPs of [`crate::SERVICE_CLUSTER_IP_RANGE`] (kube-proxy), and
//! kube-apiserver is the `kubernetes` Service's endpoint at the node's address, so in-cluster
//! clients (an operator, a producer) reach it the way they do in any cluster.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as NodeObject, ServiceAccount};
use kube::Api;

mod cgroups;
mod host;
mod namespaces;

pub use namespaces::enter_namespaces;

use cgroups::Cgroups;
use host::{path_with, run, toml_string, which, write};
use namespaces::{ensure_own_network_namespace, unmount_under};

use crate::control_plane::{
    block_on_own_runtime, flag, InCluster, KUBERNETES_SERVICE_IP, SERVICE_CLUSTER_IP_RANGE,
};
use crate::process::{self, ScratchDir};
use crate::tokens::{self, TokenUser};
use crate::{Binaries, ControlPlane, Error, Options};

/// The node's name (its kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "burst-prefix-node";
/// The node's address: the bridge's, the pods' gateway and kube-apiserver's advertised address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pod network of the cluster; the node's own is [`POD_CIDR`].
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The node's pods: the first /24 of [`CLUSTER_CIDR`], as kube-controller-manager allocates it.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The bridge the CNI bridge plugin attaches every pod to.
const BRIDGE: &str = "bp0";

/// How long the node may take to become Ready (about 9 s here, with the control plane).
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const STOP_GRACE: Duration = Duration::from_secs(10);
const LOG_TAIL_LINES: usize = 30;

/// What the node is given before it starts.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// OCI image archives to import into containerd before the kubelet starts (the pods' images:
    /// the node pulls nothing).
    pub images: Vec<PathBuf>,
    /// The pods' sandbox image (containerd's `sandbox` pinned image); it must be in `images`.
    pub sandbox_image: String,
}

/// A running node and its control plane; dropping it stops everything and removes its files.
#[derive(Debug)]
pub struct Node {
    processes: Mutex<Vec<Component>>,
    cgroups: Cgroups,
    containerd_socket: PathBuf,
    // Dropped after the processes are stopped: the control plane, then the node's directory.
    control_plane: ControlPlane,
    dir: ScratchDir,
}

#[derive(Debug)]
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Node {
    /// Starts a control plane for in-cluster clients and a node, and waits until the node is
    /// Ready, the `default` ServiceAccount exists and the `kubernetes` Service's ClusterIP
    /// answers. Needs root, [`enter_namespaces`] first, and the binaries of
    /// `make control-plane` and `make node-deps`.
    pub fn start(options: NodeOptions) -> Result<Self, Error> {
        ensure_own_network_namespace()?;
        let binaries = Binaries::locate()?;
        for name in [
            "kubelet",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
        ] {
            binaries.get(name)?;
        }
        setup_network()?;

        let kubelet_user = TokenUser::new(format!("system:node:{NODE_NAME}"), &["system:nodes"]);
        let control_plane = ControlPlane::start(Options {
            users: vec![kubelet_user.clone()],
            in_cluster: Some(InCluster {
                advertise_address: NODE_IP,
            }),
        })?;

        let dir = ScratchDir::create("burst-prefix-node-")
            .map_err(|e| Error::io("creating the node's temp directory", e))?;
        let cgroups = Cgroups::create(&format!(
            "burst-prefix-node-{}-{}",
            std::process::id(),
            tokens::random_hex(3)
        ))?;
        let containerd_socket = dir.path().join("containerd/containerd.sock");
        let mut node = Self {
            processes: Mutex::new(Vec::new()),
            cgroups,
            containerd_socket,
            control_plane,
            dir,
        };
        // From here on a failure drops `node`: whatever started is stopped.
        node.start_containerd(&binaries, &options)?;
        node.import_images(&binaries, &options.images)?;
        node.start_control_loops(&binaries)?;
        node.start_kubelet(&binaries, &kubelet_user)?;
        node.start_kube_proxy(&binaries)?;
        block_on_own_runtime(node.wait_ready())?;
        Ok(node)
    }

    /// The node's control plane (admin clients, kubeconfig, kubectl and helm commands).
    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    /// The node's temp directory (component logs, configs, containerd's and the kubelet's state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Gives an image already in the node's containerd a second name (`ctr images tag`), so
    /// that a pod may run it as a different image reference without pulling anything: what a
    /// new release of an image looks like to Kubernetes.
    pub fn tag_image(&self, source: &str, target: &str) -> Result<(), Error> {
        let output = self.ctr(&Binaries::locate()?, &["images", "tag", source, target])?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::CommandFailed(format!(
                "ctr images tag {source} {target}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }

    /// The last lines of every component's log, and of the control plane's, for a failure
    /// message.
    pub fn logs_tail(&self, lines: usize) -> String {
        let processes = self.lock_processes();
        let mut tails: Vec<String> = processes
            .iter()
            .map(|component| process::log_tail(&component.log, lines))
            .collect();
        tails.push(self.control_plane.logs_tail(lines));
        tails.join("\n")
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<Component>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn(&self, name: &'static str, command: Command) -> Result<(), Error> {
        let log = self.path(&format!("{name}.log"));
        let child = process::spawn_supervised(command, &log)
            .map_err(|e| Error::io(format!("starting {name}"), e))?;
        self.lock_processes().push(Component { name, child, log });
        Ok(())
    }

    fn start_containerd(
        &mut self,
        binaries: &Binaries,
        options: &NodeOptions,
    ) -> Result<(), Error> {
        let runc = which("runc")?;
        let cni_bin = Path::new("/usr/lib/cni");
        if !cni_bin.join("bridge").exists() {
            return Err(Error::Node {
                reason: "no CNI plugins in /usr/lib/cni: run `make node-deps`".into(),
                logs: String::new(),
            });
        }
        let q = |p: &Path| toml_string(&p.to_string_lossy());
        let config = format!(
            r#"version = 3
root = {root}
state = {state}
# Plugins the node does not use (and whose start-up needs what the machine may lack).
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {sandbox}

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # These machines withhold CAP_SYS_RESOURCE even from root, so no process may lower its
  # oom_score_adj: the kubelet asks -998 for every sandbox, which runc could not set.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{cni_bin}]
    conf_dir = {cni_conf}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {runc}
        Root = {runc_root}
        SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            root = q(&self.path("containerd/root")),
            state = q(&self.path("containerd/state")),
            socket = q(&self.containerd_socket),
            ttrpc = q(&self.path("containerd/containerd.sock.ttrpc")),
            opt = q(&self.path("containerd/opt")),
            sandbox = toml_string(&options.sandbox_image),
            cni_bin = q(cni_bin),
            cni_conf = q(&self.path("cni/net.d")),
            runc = q(&runc),
            runc_root = q(&self.path("runc")),
        );
        write(&self.path("containerd/config.toml"), &config)?;
        write(
            &self.path("cni/net.d/10-burst-prefix.conflist"),
            &self.cni_config(),
        )?;

        // containerd, and with it every shim it starts, in the node's cgroup, so that stopping
        // the node can kill them all (a shim outlives containerd by design).
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.cgroups.procs_file("containerd")?)
            .arg(binaries.get("containerd")?)
            .arg("--config")
            .arg(self.path("containerd/config.toml"))
            .env("PATH", path_with(binaries.dir()));
        self.spawn("containerd", command)?;

        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .ctr(binaries, &["version"])
            .is_ok_and(|o| o.status.success())
        {
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(self.not_ready("containerd did not answer within 30s".into()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    fn cni_config(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "burst-prefix",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": true,
                    "isDefaultGateway": true,
                    // A pod that reaches itself through its own Service.
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP.to_string()}]],
                        "dataDir": self.path("cni/ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        }))
        .expect("a JSON value serializes")
    }

    fn ctr(&self, binaries: &Binaries, args: &[&str]) -> Result<std::process::Output, Error> {
        Command::new(binaries.get("ctr")?)
            .arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io("running ctr", e))
    }

    fn import_images(&self, binaries: &Binaries, images: &[PathBuf]) -> Result<(), Error> {
        for image in images {
            let archive = image.to_string_lossy();
            let output = self.ctr(binaries, &["images", "import", &archive])?;
            if !output.status.success() {
                return Err(self.not_ready(format!(
                    "ctr images import {archive}: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
        }
        Ok(())
    }

    /// kube-controller-manager and kube-scheduler, as cluster admins.
    fn start_control_loops(&self, binaries: &Binaries) -> Result<(), Error> {
        let kubeconfig = self.control_plane.kubeconfig();
        let mut controller_manager = Command::new(binaries.get("kube-controller-manager")?);
        controller_manager.args([
            flag("--kubeconfig", kubeconfig),
            // No serving: nothing here scrapes it.
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            "--allocate-node-cidrs=true".into(),
            flag("--cluster-cidr", CLUSTER_CIDR),
            "--node-cidr-mask-size=24".into(),
            flag("--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE),
            // Published in every namespace as kube-root-ca.crt, which token volumes include.
            flag("--root-ca-file", self.control_plane.ca_file()),
            flag(
                "--service-account-private-key-file",
                self.control_plane.service_account_key_file(),
            ),
        ]);
        self.spawn("kube-controller-manager", controller_manager)?;

        let mut scheduler = Command::new(binaries.get("kube-scheduler")?);
        scheduler.args([
            flag("--kubeconfig", kubeconfig),
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
        ]);
        self.spawn("kube-scheduler", scheduler)
    }

    fn start_kubelet(&self, binaries: &Binaries, user: &TokenUser) -> Result<(), Error> {
        let kubeconfig = self.control_plane.kubeconfig_for(&user.name, &user.token)?;
        // No DNS server in the node's network: pods get an empty resolv.conf, never the machine's.
        write(&self.path("kubelet/resolv.conf"), "")?;
        let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).expect("serializes");
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These machines run cgroup v1, which the kubelet refuses unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: {runtime}
address: {address}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# Only kube-apiserver (logs, port-forward) reaches it, inside the node's network namespace.
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
resolvConf: {resolv}
clusterDomain: cluster.local
podLogsDir: {pod_logs}
failSwapOn: false
# Its default, -999, needs CAP_SYS_RESOURCE, which these machines withhold even from root.
oomScoreAdj: 0
# The test's pods are tiny; the machine's disk and memory are not the node's to judge.
evictionHard: {{memory.available: "1%", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
serializeImagePulls: false
maxPods: 50
"#,
            cgroup_root = serde_json::to_string(&format!("/{}", self.cgroups.name())).expect("s"),
            runtime =
                serde_json::to_string(&format!("unix://{}", self.containerd_socket.display()))
                    .expect("serializes"),
            address = NODE_IP,
            resolv = q(&self.path("kubelet/resolv.conf")),
            pod_logs = q(&self.path("kubelet/pod-logs")),
        );
        write(&self.path("kubelet/config.yaml"), &config)?;
        let mut kubelet = Command::new(binaries.get("kubelet")?);
        kubelet
            .args([
                flag("--config", self.path("kubelet/config.yaml")),
                flag("--kubeconfig", &kubeconfig),
                flag("--root-dir", self.path("kubelet/root")),
                flag("--cert-dir", self.path("kubelet/pki")),
                flag("--hostname-override", NODE_NAME),
                flag("--node-ip", NODE_IP.to_string()),
            ])
            .env("PATH", path_with(binaries.dir()));
        self.spawn("kubelet", kubelet)
    }

    fn start_kube_proxy(&self, binaries: &Binaries) -> Result<(), Error> {
        let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).expect("serializes");
        let config = format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
# Its default, -999, needs CAP_SYS_RESOURCE, which these machines withhold even from root.
oomScoreAdj: 0
clusterCIDR: {cluster_cidr}
hostnameOverride: {node}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack table is the machine's, not the node's: leave its size and timeouts alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
            kubeconfig = q(self.control_plane.kubeconfig()),
            cluster_cidr = CLUSTER_CIDR,
            node = NODE_NAME,
        );
        write(&self.path("kube-proxy/config.yaml"), &config)?;
        let mut kube_proxy = Command::new(binaries.get("kube-proxy")?);
        kube_proxy.arg(flag("--config", self.path("kube-proxy/config.yaml")));
        self.spawn("kube-proxy", kube_proxy)
    }

    async fn wait_ready(&self) -> Result<(), Error> {
        let client = self.control_plane.client();
        let nodes = Api::<NodeObject>::all(client.clone());
        let accounts = Api::<ServiceAccount>::namespaced(client, "default");
        let service = SocketAddr::from((KUBERNETES_SERVICE_IP, 443));
        let start = Instant::now();
        loop {
            self.check_running()?;
            let node_ready = match nodes.get_opt(NODE_NAME).await {
                Ok(Some(node)) => node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| {
                        format!(
                            "Ready={} ({})",
                            c.status,
                            c.message.clone().unwrap_or_default()
                        )
                    }),
                Ok(None) => None,
                Err(err) => Some(format!("reading the node: {err}")),
            };
            let account = matches!(accounts.get_opt("default").await, Ok(Some(_)));
            // kube-proxy's DNAT to kube-apiserver, as in-cluster clients use it.
            let service_answers =
                TcpStream::connect_timeout(&service, Duration::from_secs(1)).is_ok();
            if node_ready
                .as_deref()
                .is_some_and(|r| r.starts_with("Ready=True"))
                && account
                && service_answers
            {
                return Ok(());
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.not_ready(format!(
                    "not ready after {READY_TIMEOUT:?}: node {NODE_NAME}: {}, default \
                     ServiceAccount: {account}, {service} answers: {service_answers}",
                    node_ready.unwrap_or_else(|| "not registered".into())
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Fails when a component has exited.
    fn check_running(&self) -> Result<(), Error> {
        let exited = self
            .lock_processes()
            .iter_mut()
            .find_map(|c| match c.child.try_wait() {
                Ok(Some(status)) => Some(format!("{} exited ({status})", c.name)),
                _ => None,
            });
        match exited {
            Some(reason) => Err(self.not_ready(reason)),
            None => Ok(()),
        }
    }

    fn not_ready(&self, reason: String) -> Error {
        Error::Node {
            reason,
            logs: self.logs_tail(LOG_TAIL_LINES),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Everything but containerd, newest first (kube-proxy, the kubelet, the scheduler, the
        // controller manager), so that nothing restarts what is killed next.
        let mut processes = self.lock_processes();
        for component in processes.iter_mut().rev() {
            if component.name != "containerd" {
                process::stop(&mut component.child, STOP_GRACE);
            }
        }
        // containerd, its shims and every container: the node's cgroups.
        self.cgroups.kill_all();
        for component in processes.iter_mut() {
            let _ = component.child.wait();
        }
        drop(processes);
        unmount_under(self.dir.path());
        self.cgroups.remove();
    }
}

/// The bridge with the node's address, forwarding on (pods reach Services through the node),
/// and the Service range routed to the bridge so that the node itself reaches ClusterIPs too.
fn setup_network() -> Result<(), Error> {
    let address = format!("{NODE_IP}/24");
    run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
    run(Command::new("ip").args(["addr", "add", &address, "dev", BRIDGE]))?;
    run(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
    run(Command::new("ip").args(["route", "add", SERVICE_CLUSTER_IP_RANGE, "dev", BRIDGE]))?;
    // Both are per network namespace: these are the node's own.
    write(Path::new("/proc/sys/net/ipv4/ip_forward"), "1")?;
    write(
        Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables"),
        "1",
    )
}
