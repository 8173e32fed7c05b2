//! `burst-prefix-operator`: the controller, and the generator of its CRD.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use burst_prefix_operator::controller;
use burst_prefix_operator::metrics::Metrics;
use clap::{Parser, Subcommand, ValueEnum};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tracing::{error, info};

#[derive(Parser)]
#[command(
    name = "burst-prefix-operator",
    version,
    about = "Reconciles BurstPrefixPolicy resources into burst-prefix producers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller. The kubeconfig is found the usual way: KUBECONFIG, ~/.kube/config,
    /// or the in-cluster service account.
    Run(RunArgs),
    /// Print the BurstPrefixPolicy CRD as YAML (what crds/ and the chart hold).
    Crd,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Serve /healthz and /metrics here.
    #[arg(
        long,
        env = "BURST_PREFIX_ADMIN_LISTEN",
        default_value = "0.0.0.0:8081"
    )]
    admin_listen: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "BURST_PREFIX_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Take a coordination.k8s.io Lease before reconciling, so that several replicas can run
    /// with one active.
    #[arg(long, env = "BURST_PREFIX_LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "BURST_PREFIX_LEASE_NAME",
        default_value = "burst-prefix-operator"
    )]
    lease_name: String,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// How long a Lease holds without renewal; a follower takes over this long after the
    /// leader is gone.
    #[arg(long, env = "BURST_PREFIX_LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_duration_seconds: u64,
    /// This replica's identity in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Log format.
    #[arg(long, env = "BURST_PREFIX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing env-filter syntax), e.g. `info` or `burst_prefix_operator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", burst_prefix_api::policy::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Run(args) => {
            init_logs(args.log_format, &args.log_level);
            let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    error!("{message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_logs(format: LogFormat, filter: &str) {
    let builder = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_new(filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    );
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(args: RunArgs) -> Result<(), String> {
    let metrics = Metrics::default();
    let client = Client::try_default().await.map_err(|e| {
        format!("cannot reach Kubernetes (KUBECONFIG, ~/.kube/config or in-cluster): {e}")
    })?;
    let listener = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.admin_listen))?;
    let admin_metrics = metrics.clone();
    let ready = Arc::new(AtomicBool::new(false));
    let readiness = ready.clone();
    let admin = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // Ready once the CRD was found and the watches are running (followers too).
        .route(
            "/readyz",
            get(move || async move {
                if readiness.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .route(
            "/metrics",
            get(move || async move { admin_metrics.render() }),
        );
    info!(address = %args.admin_listen, "admin endpoints /healthz, /readyz and /metrics");
    tokio::spawn(async move { axum::serve(listener, admin).await });

    let controller = controller::run(
        client.clone(),
        metrics.clone(),
        args.watch_namespace.clone(),
        ready.clone(),
    );
    if !args.leader_elect {
        return controller.await.map_err(|e| e.to_string());
    }
    let identity = args.identity.unwrap_or_else(|| {
        std::env::var("HOSTNAME")
            .unwrap_or_else(|_| format!("burst-prefix-operator-{}", std::process::id()))
    });
    let client_for_check = client.clone();
    let manager = LeaseManagerBuilder::new(client, &args.lease_name)
        .with_namespace(&args.lease_namespace)
        .with_identity(&identity)
        .with_duration(args.lease_duration_seconds)
        // Renew well before expiry (the grace must be shorter than the duration).
        .with_grace((args.lease_duration_seconds / 3).max(1))
        .build()
        .await
        .map_err(|e| format!("cannot set up the leader lease: {e}"))?;
    // A follower is ready too (it stands by); only the CRD must be there.
    let policies = match &args.watch_namespace {
        Some(ns) => kube::Api::namespaced(client_for_check.clone(), ns),
        None => kube::Api::all(client_for_check.clone()),
    };
    controller::check_crd(&policies)
        .await
        .map_err(|e| e.to_string())?;
    ready.store(true, Ordering::Relaxed);
    let (mut leading, _lease_task) = manager.watch().await;
    info!(lease = %format!("{}/{}", args.lease_namespace, args.lease_name), %identity, "waiting for the leader lease");
    while !*leading.borrow_and_update() {
        leading
            .changed()
            .await
            .map_err(|_| "the lease manager stopped".to_string())?;
    }
    info!(%identity, "acquired the leader lease; reconciling");
    metrics.leader.set(1);
    tokio::select! {
        result = controller => result.map_err(|e| e.to_string()),
        _ = async {
            while *leading.borrow_and_update() {
                if leading.changed().await.is_err() { break; }
            }
        } => {
            metrics.leader.set(0);
            // Exit so that the pod restarts as a follower: no reconcile runs without the lease.
            Err("lost the leader lease; exiting".to_string())
        }
    }
}
