//! Leader election with a `coordination.k8s.io` Lease (kube-lease-manager), for the operator
//! (one active reconciler) and the producer (one active window per policy, docs/behaviour.md §10).
//!
//! Holding a Lease that exists takes `get` and `patch` on it ([`LEASE_VERBS`]); creating a
//! missing one also takes `create` (which RBAC cannot restrict to one name), so the chart
//! creates the operator's Lease and the operator creates each producer's.

use std::time::Duration;

use clap::Args;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::flags;

/// The verbs that holding an existing Lease takes (what a Role must grant on it).
pub const LEASE_VERBS: &[&str] = &["get", "patch"];

#[derive(Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Take a coordination.k8s.io Lease before acting, so that several replicas can run with
    /// one active; the others stand by and take over when the Lease lapses.
    #[arg(long = flags::LEADER_ELECT, env = "BURST_PREFIX_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the Lease (default: the binary's name).
    #[arg(long = flags::LEASE_NAME, env = "BURST_PREFIX_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Namespace of the Lease.
    #[arg(long = flags::LEASE_NAMESPACE, env = flags::POD_NAMESPACE_ENV, default_value = "default")]
    pub lease_namespace: String,
    /// How long a Lease holds without renewal: a follower takes over this long after the
    /// leader is gone. The holder renews every third of it.
    #[arg(long = flags::LEASE_DURATION_SECONDS, env = "BURST_PREFIX_LEASE_DURATION_SECONDS",
          default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_duration_seconds: u64,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long = flags::IDENTITY, env = flags::POD_NAME_ENV)]
    pub identity: Option<String>,
}

impl LeaderArgs {
    /// The identity: `--identity`, `$POD_NAME`, `$HOSTNAME`, or `<binary>-<pid>`.
    pub fn identity_or(&self, binary: &str) -> String {
        self.identity.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME").unwrap_or_else(|_| format!("{binary}-{}", std::process::id()))
        })
    }
}

/// This process's part in one Lease: whether it leads, as it changes.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    // Dropping the receiver ends the manager task, which releases the Lease.
    _task: JoinHandle<()>,
    /// `namespace/name` of the Lease.
    pub lease: String,
    pub identity: String,
}

impl Leadership {
    /// Starts competing for Lease `namespace/name` as `identity`.
    pub async fn start(
        client: kube::Client,
        name: &str,
        namespace: &str,
        identity: &str,
        duration: Duration,
    ) -> Result<Leadership, String> {
        let seconds = duration.as_secs().max(2);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(seconds)
            // Renew well before expiry (the grace must be shorter than the duration).
            .with_grace((seconds / 3).max(1))
            .build()
            .await
            .map_err(|e| format!("cannot set up Lease {namespace}/{name}: {e}"))?;
        let (leading, task) = manager.watch().await;
        let lease = format!("{namespace}/{name}");
        let task_lease = lease.clone();
        let task = tokio::spawn(async move {
            match task.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::error!(lease = %task_lease, error = %e, "the Lease manager stopped")
                }
                Err(e) => {
                    tracing::error!(lease = %task_lease, error = %e, "the Lease manager panicked")
                }
            }
        });
        Ok(Leadership {
            leading,
            _task: task,
            lease,
            identity: identity.to_string(),
        })
    }

    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// A receiver that sees every change of leadership.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Waits until this process leads; `Err` when the Lease manager stopped.
    pub async fn acquired(&mut self) -> Result<(), String> {
        self.leading
            .wait_for(|leading| *leading)
            .await
            .map(|_| ())
            .map_err(|_| format!("the manager of Lease {} stopped", self.lease))
    }

    /// Waits until this process no longer leads (or the Lease manager stopped).
    pub async fn lost(&mut self) {
        let _ = self.leading.wait_for(|leading| !*leading).await;
    }
}
