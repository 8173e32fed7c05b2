//! The feeds of what the engines say (docs/behaviour.md §7): the KV-events subscriber, the
//! `/metrics` load scraper and the tokenizer, started, changed and stopped as the config in force
//! asks (`engines` in the config). Thin adapters: what they hear goes to the core's
//! [`Engines`](burst_prefix_core::engines::Engines). They run on every producer replica, leader or not,
//! so that a follower that takes over starts warm.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_prefix_api::{Endpoint, EngineConfig, KvEventsConfig};
use burst_prefix_engine_state::load::{spawn_load_scraper, LoadReport, LoadScraperConfig};
use burst_prefix_engine_state::speed::{Verdict, MAX_RUNNING};
use burst_prefix_engine_state::{
    EngineEndpoint, EngineUpdate, KvEventsMetrics, KvEventsSubscriber, SubscriberConfig, Topology,
};
use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use burst_prefix_core::engines::Engines;
use burst_prefix_core::Producer;

/// How often the config in force is looked at for changes.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Runs the feeds the config asks for until aborted (the service's shutdown) or the runtime
/// stops; dropped, it drops the subscriber and ends the scraper.
pub async fn follow(producer: Producer) {
    let metrics = match KvEventsMetrics::register(producer.metrics().registry()) {
        Ok(metrics) => metrics,
        Err(error) => {
            tracing::error!(%error, "cannot register the KV-events metrics; engine feeds are off");
            return;
        }
    };
    let scrape_failures = match IntCounterVec::new(
        Opts::new(
            "burst_prefix_engine_scrape_failures_total",
            "Scrapes of an engine's /metrics that taught nothing, by endpoint and reason: timeout (no answer read and parsed within 500 ms), too_large (over 4 MiB), http, status (not 200), unparsable (no vLLM load metrics), rejected_sample (counters that moved more than an engine can, or a gauge past what one runs; docs/behaviour.md §7)",
        ),
        &["endpoint", "reason"],
    )
    .and_then(|counter| {
        producer
            .metrics()
            .registry()
            .register(Box::new(counter.clone()))
            .map(|()| counter)
    }) {
        Ok(counter) => counter,
        Err(error) => {
            tracing::error!(%error, "cannot register the scrape metrics; engine feeds are off");
            return;
        }
    };
    let (endpoints, _) = watch::channel(Vec::new());
    let mut feeds = Feeds {
        engines: producer.engines().clone(),
        metrics,
        scrape_failures,
        endpoints,
        events: None,
        load: None,
        tokenizer: None,
    };
    let mut generation = 0;
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    loop {
        tick.tick().await;
        let Some(snapshot) = producer.config() else {
            continue;
        };
        if snapshot.generation == generation {
            continue;
        }
        generation = snapshot.generation;
        feeds
            .follow(&snapshot.config.planner.engines, &snapshot.config.endpoints)
            .await;
    }
}

struct Feeds {
    engines: Arc<Engines>,
    metrics: KvEventsMetrics,
    /// `burst_prefix_engine_scrape_failures_total{endpoint, reason}`.
    scrape_failures: IntCounterVec,
    /// The endpoints the subscriber and the scraper follow.
    endpoints: watch::Sender<Vec<EngineEndpoint>>,
    /// The subscriber, its config and the task applying what it hears.
    events: Option<(KvEventsConfig, KvEventsSubscriber, JoinHandle<()>)>,
    /// The scraper, its interval and the task recording what it reads.
    load: Option<(u64, JoinHandle<()>, JoinHandle<()>)>,
    tokenizer: Option<String>,
}

impl Feeds {
    async fn follow(&mut self, config: &EngineConfig, endpoints: &[Endpoint]) {
        let engine_endpoints: Vec<EngineEndpoint> =
            endpoints.iter().filter_map(engine_endpoint).collect();
        // The failure series of endpoints that left go with them.
        for series in self
            .scrape_failures
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
        {
            let label = |name: &str| {
                series
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value().to_string())
            };
            if let (Some(endpoint), Some(reason)) = (label("endpoint"), label("reason")) {
                if !engine_endpoints.iter().any(|e| e.id == endpoint) {
                    let _ = self
                        .scrape_failures
                        .remove_label_values(&[&endpoint, &reason]);
                }
            }
        }
        self.endpoints.send_replace(engine_endpoints);
        self.follow_tokenizer(config.tokenizer.as_ref().map(|t| t.path.as_str()));
        self.follow_events(config.kv_events.as_ref()).await;
        self.follow_load(config.load_interval_ms);
    }

    fn follow_tokenizer(&mut self, path: Option<&str>) {
        if self.tokenizer.as_deref() == path {
            return;
        }
        match self.engines.use_tokenizer(path.map(Path::new)) {
            Ok(()) => {
                if let Some(path) = path {
                    tracing::info!(path, "tokenizer in use: prompts are hashed as its tokens");
                }
                self.tokenizer = path.map(str::to_string);
            }
            // Tried again with the next config; prompts are hashed as estimates meanwhile.
            Err(error) => tracing::warn!(%error, "cannot use the tokenizer"),
        }
    }

    async fn follow_events(&mut self, config: Option<&KvEventsConfig>) {
        if self.events.as_ref().map(|(c, _, _)| c) == config {
            return;
        }
        if let Some((_, subscriber, applier)) = self.events.take() {
            drop(subscriber);
            applier.abort();
        }
        let Some(config) = config else {
            return;
        };
        let topology = match (&config.bind, config.connect_port) {
            (Some(endpoint), _) => Topology::Bind {
                endpoint: endpoint.clone(),
            },
            (None, port) if port > 0 => Topology::connect_port(port as u16),
            (None, _) => return,
        };
        let mut subscriber_config = SubscriberConfig::new(topology);
        if config.replay_port > 0 {
            subscriber_config.replay_address =
                Some(format!("tcp://{{host}}:{}", config.replay_port));
        }
        let (updates, mut received) = mpsc::channel(4096);
        let subscribed = KvEventsSubscriber::spawn(
            subscriber_config,
            self.endpoints.subscribe(),
            updates,
            self.metrics.clone(),
        )
        .await;
        let subscriber = match subscribed {
            Ok(subscriber) => subscriber,
            Err(error) => {
                tracing::error!(%error, "cannot subscribe to the engines' KV events");
                return;
            }
        };
        tracing::info!(
            bound = subscriber.bound_endpoint().unwrap_or("-"),
            connect_port = config.connect_port,
            "following the engines' KV events"
        );
        let engines = self.engines.clone();
        let metrics = self.metrics.clone();
        let applier = tokio::spawn(async move {
            while let Some(update) = received.recv().await {
                match update {
                    EngineUpdate::Batch { replica, batch, .. } => {
                        let cleared = batch.events.iter().any(|event| {
                            matches!(
                                event,
                                burst_prefix_engine_state::decode::Event::AllBlocksCleared
                            )
                        });
                        let report = engines.index().apply(&replica, &batch);
                        metrics.record_apply(&report);
                        if cleared {
                            // The engine dropped its cache: our model of it goes too.
                            engines.reset(Some(std::slice::from_ref(&replica)));
                        }
                    }
                    EngineUpdate::Clear { replica, .. } => {
                        engines.index().clear(&replica);
                    }
                }
            }
        });
        self.events = Some((config.clone(), subscriber, applier));
    }

    fn follow_load(&mut self, interval_ms: i64) {
        let interval_ms = u64::try_from(interval_ms).unwrap_or(0);
        if self.load.as_ref().map(|(i, _, _)| *i) == Some(interval_ms)
            || (self.load.is_none() && interval_ms == 0)
        {
            return;
        }
        if let Some((_, scraper, recorder)) = self.load.take() {
            scraper.abort();
            recorder.abort();
        }
        if interval_ms == 0 {
            return;
        }
        let (reports, mut received) = mpsc::channel::<LoadReport>(256);
        let config = LoadScraperConfig {
            interval: Duration::from_millis(interval_ms),
            ..LoadScraperConfig::default()
        };
        let scraper = spawn_load_scraper(config, self.endpoints.subscribe(), reports);
        let engines = self.engines.clone();
        let failures = self.scrape_failures.clone();
        let started = Instant::now();
        let recorder = tokio::spawn(async move {
            while let Some(report) = received.recv().await {
                let fail = |reason: &str| {
                    failures
                        .with_label_values(&[report.replica.as_str(), reason])
                        .inc()
                };
                let load = match report.load {
                    Ok((loads, counters)) => {
                        let at = started.elapsed().as_secs_f64();
                        let verdict = engines.observe_speed(&report.replica, counters, at);
                        if matches!(verdict, Verdict::Rejected(_)) {
                            fail("rejected_sample");
                        }
                        // A gauge no engine runs is no load either.
                        let requests: f64 = loads
                            .iter()
                            .map(|l| l.running.max(0.0) + l.waiting.max(0.0))
                            .sum();
                        (requests <= MAX_RUNNING).then_some(requests as u64)
                    }
                    Err(error) => {
                        fail(error.metric_label());
                        tracing::debug!(replica = report.replica, %error, "scrape failed");
                        None
                    }
                };
                engines.set_load(&report.replica, load);
            }
        });
        self.load = Some((interval_ms, scraper, recorder));
    }
}

/// An endpoint as the engine feeds reach it: its host and HTTP port, from `ip:port`.
fn engine_endpoint(endpoint: &Endpoint) -> Option<EngineEndpoint> {
    let addr = endpoint.socket_addr()?;
    Some(EngineEndpoint {
        id: endpoint.id.clone(),
        host: addr.ip().to_string(),
        http_port: addr.port(),
    })
}
