//! `burst-prefix-operator`: the controller, and the generator of its CRD.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use burst_prefix_api::policy::DEFAULT_PRODUCER_IMAGE;
use burst_prefix_operator::backoff::RetryBackoff;
use burst_prefix_operator::context::{Context, Settings};
use burst_prefix_operator::controller;
use burst_prefix_operator::desired::{default_resources, NetworkPolicyPeers, ProducerDefaults};
use burst_prefix_operator::metrics::Metrics;
use burst_prefix_operator::pool_api::PoolApi;
use burst_prefix_operator::validate::ImagePolicy;
use burst_prefix_operator::FIELD_MANAGER;
use burst_prefix_runtime::api_access::ApiAccess;
use burst_prefix_runtime::leader::{LeaderArgs, Leadership};
use burst_prefix_runtime::logging::{self, LogArgs, LogFormat};
use burst_prefix_runtime::{admin, flags};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
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
    Run(Box<RunArgs>),
    /// Print the BurstPrefixPolicy CRD as YAML (what crds/ and the chart hold).
    Crd,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(
        long,
        env = "BURST_PREFIX_ADMIN_LISTEN",
        default_value = "0.0.0.0:8081"
    )]
    admin_listen: SocketAddr,
    /// Watch only these namespaces (repeat the flag or separate with commas; default: all
    /// namespaces). One controller, with its own watches, runs per namespace.
    #[arg(
        long = "watch-namespace",
        env = "BURST_PREFIX_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    watch_namespaces: Vec<String>,
    /// Watch (and use as endpoints) only pods with these labels, e.g.
    /// `app.kubernetes.io/component=model-server`: fewer pod events when the namespaces hold
    /// many other pods. A policy's own selector still applies on top.
    #[arg(long, env = "BURST_PREFIX_POD_SELECTOR")]
    pod_selector: Option<String>,
    /// The producer image of every policy that does not name its own (`spec.producer.image`).
    /// Changing it (a chart upgrade) rolls every such producer.
    #[arg(long, env = "BURST_PREFIX_PRODUCER_IMAGE", default_value = DEFAULT_PRODUCER_IMAGE)]
    producer_image: String,
    /// The producers' imagePullPolicy (default: Kubernetes' default for the tag).
    #[arg(long, value_parser = ["Always", "IfNotPresent", "Never"])]
    producer_image_pull_policy: Option<String>,
    /// A Secret (in each policy's namespace) to pull the producer image with; repeatable.
    #[arg(long = "producer-image-pull-secret")]
    producer_image_pull_secrets: Vec<String>,
    /// The producer container's resources when a policy sets none, as JSON, e.g.
    /// '{"requests":{"cpu":"100m","memory":"64Mi"},"limits":{"memory":"512Mi"}}' (the default).
    #[arg(long, value_parser = parse_resources)]
    producer_resources: Option<ResourceRequirements>,
    /// A NetworkPolicy for every producer: who may reach its API port, its endpoint picker and
    /// its admin port, as JSON lists of NetworkPolicy peers, e.g.
    /// '{"api":[{"podSelector":{}}],"endpointPicker":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"gateways"}}}],"admin":[]}'.
    /// A port with no peers is closed. Without the flag, no NetworkPolicy (and the ones made
    /// before are deleted).
    #[arg(long, value_parser = NetworkPolicyPeers::from_json)]
    producer_network_policy: Option<NetworkPolicyPeers>,
    /// A policy's own `spec.producer.image` must start with one of these (repeatable); without
    /// any, a policy may name any image. A policy that breaks it gets InvalidConfig.
    #[arg(long = "allowed-producer-image-prefix")]
    allowed_producer_image_prefixes: Vec<String>,
    /// How often to look for the InferencePool API while it is not served.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pool_api_recheck_seconds: u64,
    /// /readyz fails once the API server has refused the operator (401 Unauthorized, 403
    /// Forbidden) for longer than this, e.g. after its ServiceAccount or RoleBinding was deleted.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400))]
    api_refusal_grace_seconds: u64,
    /// A failing policy is retried after 1 s, then twice as long each time, up to this.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    retry_max_seconds: u64,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    log: LogArgs,
}

fn parse_resources(json: &str) -> Result<ResourceRequirements, String> {
    serde_json::from_str(json).map_err(|e| format!("not a ResourceRequirements JSON object: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", burst_prefix_api::policy::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Run(args) => {
            if let Err(message) = logging::init(&args.log) {
                eprintln!("error: {message}");
                return ExitCode::from(2);
            }
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    error!("{message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(args: RunArgs) -> Result<(), String> {
    let metrics = Metrics::default();
    let client = Client::try_default().await.map_err(|e| {
        format!("cannot reach Kubernetes (KUBECONFIG, ~/.kube/config or in-cluster): {e}")
    })?;
    let access = Arc::new(ApiAccess::new(Duration::from_secs(
        args.api_refusal_grace_seconds,
    )));
    let started = Arc::new(AtomicBool::new(false));
    let readiness: admin::Readiness = {
        let (started, access) = (started.clone(), access.clone());
        Arc::new(move || {
            if !started.load(Ordering::Relaxed) {
                return Err("starting: the CRD was not found yet".into());
            }
            access.check()
        })
    };
    let listener = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .map_err(|e| format!("cannot listen on --admin-listen {}: {e}", args.admin_listen))?;
    info!(address = %args.admin_listen, "admin endpoints /healthz, /readyz and /metrics");
    let router = admin::router(readiness, metrics.registry.clone());
    tokio::spawn(admin::serve(listener, router, std::future::pending()));

    // None: one controller over all namespaces.
    let namespaces: Vec<Option<String>> = if args.watch_namespaces.is_empty() {
        vec![None]
    } else {
        args.watch_namespaces.iter().cloned().map(Some).collect()
    };
    // A follower is ready too (it stands by); only the CRD must be there.
    for namespace in &namespaces {
        controller::check_crd(&client, namespace.as_deref())
            .await
            .map_err(|e| e.to_string())?;
    }
    started.store(true, Ordering::Relaxed);

    let identity = args.leader.identity_or("burst-prefix-operator");
    let mut leadership = None;
    if args.leader.leader_elect {
        let name = args
            .leader
            .lease_name
            .clone()
            .unwrap_or_else(|| "burst-prefix-operator".into());
        let mut lease = Leadership::start(
            client.clone(),
            &name,
            &args.leader.lease_namespace,
            &identity,
            Duration::from_secs(args.leader.lease_duration_seconds),
        )
        .await?;
        info!(lease = %lease.lease, %identity, "waiting for the leader lease");
        lease.acquired().await?;
        info!(%identity, "acquired the leader lease; reconciling");
        metrics.leader.set(1);
        leadership = Some(lease);
    }

    let pool_api = Arc::new(PoolApi::new(Duration::from_secs(
        args.pool_api_recheck_seconds,
    )));
    let present = pool_api.check(&client).await;
    info!(pool_api_present = present, "InferencePool API");
    tokio::spawn({
        let (pool_api, client) = (pool_api.clone(), client.clone());
        async move { pool_api.recheck_forever(client).await }
    });
    let settings = Settings {
        producer: ProducerDefaults {
            image: args.producer_image.clone(),
            image_pull_policy: args.producer_image_pull_policy.clone(),
            image_pull_secrets: args.producer_image_pull_secrets.clone(),
            resources: args
                .producer_resources
                .clone()
                .unwrap_or_else(default_resources),
            log_format: LogFormat::Json,
            network_policy: args.producer_network_policy.clone(),
        },
        images: ImagePolicy {
            allowed_prefixes: args.allowed_producer_image_prefixes.clone(),
        },
        pod_selector: args.pod_selector.clone().filter(|s| !s.is_empty()),
        resync: Duration::from_secs(300),
    };
    info!(producer_image = %settings.producer.image, namespaces = ?args.watch_namespaces, "reconciling");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(identity.clone()),
        },
    );
    let context = Arc::new(Context::new(
        client,
        metrics.clone(),
        recorder,
        settings,
        RetryBackoff::new(
            Duration::from_secs(1),
            Duration::from_secs(args.retry_max_seconds),
        ),
        pool_api,
        access,
    ));
    let controllers = futures::future::join_all(
        namespaces
            .into_iter()
            .map(|namespace| controller::run(context.clone(), namespace)),
    );
    match leadership {
        None => {
            for result in controllers.await {
                result.map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Some(mut lease) => tokio::select! {
            results = controllers => {
                for result in results {
                    result.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            _ = lease.lost() => {
                metrics.leader.set(0);
                // Exit so that the pod restarts as a follower: no reconcile runs without the lease.
                Err(format!("lost the leader lease {} (--{}); exiting", lease.lease, flags::LEADER_ELECT))
            }
        },
    }
}
