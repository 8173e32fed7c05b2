//! Dev-only: a real Kubernetes control plane for the integration tests, envtest-style.
//!
//! [`ControlPlane::shared`] starts etcd and kube-apiserver (built by `make control-plane`, see
//! `tests/control-plane/build.sh`) on free ports of 127.0.0.1, once per test binary, and hands
//! the tests admin and non-admin clients, kubeconfig files, fresh namespaces, and a way to
//! restart kube-apiserver:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use burst_prefix_test_support::ControlPlane;
//!
//! let control_plane = ControlPlane::shared();
//! let namespace = control_plane.namespace("my-test").await?;
//! let client = control_plane.client(); // admin, in this test's runtime
//! let denied = control_plane.client_for(&control_plane.user().token); // no RBAC bindings
//! # Ok(()) }
//! ```
//!
//! [`Node`] (module [`node`]) adds what runs pods: containerd, kubelet, kube-proxy,
//! kube-scheduler and kube-controller-manager beside a control plane of its own that in-cluster
//! clients reach through the `kubernetes` Service, inside network and mount namespaces that the
//! test process enters first ([`node::enter_namespaces`]); tests/e2e_node.rs uses it.
//!
//! When the binaries are missing the harness panics and says to run `make control-plane`: a test
//! that needs a control plane never passes without one. The processes and the temp directory
//! go away with the test binary however it ends (see `process.rs`).
//!
//! [`real_engine`] says which tests on a real engine run on this CPU, and records it for the
//! summary at the end of `make test`.

mod binaries;
mod certs;
mod control_plane;
mod kubeconfig;
pub mod node;
mod process;
pub mod real_engine;
mod tokens;

use std::path::PathBuf;

pub use binaries::{Binaries, BIN_DIR_ENV};
pub use control_plane::{
    ControlPlane, InCluster, Options, KUBERNETES_SERVICE_IP, SERVICE_CLUSTER_IP_RANGE,
};
pub use node::{Node, NodeOptions};
pub use tokens::TokenUser;

/// Why the control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "control-plane binaries not found in {} (missing: {missing}); build them with \
         `make control-plane`, or run everything with `make test`",
        dir.display()
    )]
    BinariesMissing { dir: PathBuf, missing: String },

    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    #[error("generating the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),

    /// `exited`: etcd or kube-apiserver exited (rather than timing out).
    #[error("the control plane did not become ready: {reason}\n{logs}")]
    NotReady {
        exited: bool,
        reason: String,
        logs: String,
    },

    /// The node (crate::node) could not be set up, or did not become ready.
    #[error("the node did not start: {reason}\n{logs}")]
    Node { reason: String, logs: String },

    /// A command run on a started node failed: the command and what it printed.
    #[error("{0}")]
    CommandFailed(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
