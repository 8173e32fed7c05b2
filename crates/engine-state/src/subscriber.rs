//! The ZMQ subscriber: vLLM's KV events in, decoded batches (and clears) out, with replay after a
//! gap.
//!
//! Two topologies ([`Topology`]):
//! - **Bind**: the producer binds one SUB endpoint; each engine connects its publisher to it
//!   (vLLM connects when its endpoint has no `*`) and publishes with its endpoint id as the topic.
//!   Messages whose topic is not a current endpoint's id are dropped and counted.
//! - **Connect**: each engine binds its own publisher (`tcp://*:PORT`); the producer connects one
//!   SUB socket to each endpoint's port, following the endpoint set as it changes (a new endpoint
//!   is connected, a gone one disconnected). Every producer replica can do this (HA).
//!
//! Per publisher, sequence numbers are tracked ([`crate::sequence`]). After a gap, the missing
//! batches are asked from the engine's replay socket (vLLM's ROUTER on `replay_endpoint`: a
//! DEALER sends `["", start seq (8 bytes big-endian)]`, and receives `["", topic, seq, payload]`
//! for each buffered batch from `start` on, then `["", "", -1, ""]`; vLLM before 0.32 left the
//! topic out), applied in order, then the live batch. A
//! gap that cannot be filled (no replay port, no answer, or batches no longer buffered) makes the
//! replica's state unknowable, so the subscriber sends a [`EngineUpdate::Clear`] for it first:
//! the index under-predicts until new events arrive, never over-predicts. A sequence number going
//! backwards is a restarted engine: cleared too. A message that does not decode is a lost batch.
//!
//! Each publisher's messages are handled in order in one task (a replay holds that task up for
//! at most the replay timeout; ZMQ queues what arrives meanwhile).

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::decode::{decode, decode_seq, Batch, Event};
use crate::endpoints::EngineEndpoint;
use crate::index::ApplyReport;
use crate::sequence::{judge_replay, ReplayOutcome, SeqStatus, SeqTracker};

/// Where the events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// Bind one SUB socket here (e.g. `tcp://0.0.0.0:5557`); engines connect and publish with
    /// their endpoint id as the topic.
    Bind {
        /// The ZMQ endpoint to bind.
        endpoint: String,
    },
    /// Connect to each endpoint's own publisher at this address template (see
    /// [`EngineEndpoint::address`]), e.g. `tcp://{host}:5557` ([`Topology::connect_port`]).
    Connect {
        /// The publisher's address, `{host}` and `{id}` filled in per endpoint.
        address: String,
    },
}

impl Topology {
    /// Connect to each endpoint's publisher on `port` of its host (`tcp://{host}:PORT`).
    pub fn connect_port(port: u16) -> Self {
        Topology::Connect {
            address: format!("tcp://{{host}}:{port}"),
        }
    }
}

/// How the subscriber runs.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// Bind one endpoint, or connect to each engine.
    pub topology: Topology,
    /// The engines' replay socket (vLLM's `replay_endpoint`, which it binds, e.g. `tcp://*:5558`)
    /// as an address template (see [`EngineEndpoint::address`]), e.g. `tcp://{host}:5558`;
    /// `None`: no replay, a gap clears the replica.
    pub replay_address: Option<String>,
    /// The most one replay may take, connection included.
    pub replay_timeout: Duration,
    /// The most batches one replay takes (vLLM buffers 10,000 by default).
    pub max_replay_batches: usize,
    /// On first hearing a publisher whose sequence is past 0, replay what it sent before (a
    /// producer that starts, or a follower that fails over, starts warm).
    pub replay_on_join: bool,
    /// The engines' data-parallel size: in the connect topology, rank r's publisher is followed
    /// at the address's TCP port plus r, as vLLM offsets it (in the bind topology every rank
    /// connects by itself).
    pub data_parallel_size: u16,
}

impl SubscriberConfig {
    /// The given topology with a 2 s replay timeout, up to 10,000 replayed batches, replay on
    /// join, and no replay socket.
    pub fn new(topology: Topology) -> Self {
        SubscriberConfig {
            topology,
            replay_address: None,
            replay_timeout: Duration::from_secs(2),
            max_replay_batches: 10_000,
            replay_on_join: true,
            data_parallel_size: 1,
        }
    }
}

/// Why a replica's state was dropped by the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearReason {
    /// The publisher's sequence went backwards: the engine restarted.
    Restarted,
    /// Batches were lost and could not be replayed.
    Lost,
    /// A batch did not decode.
    Undecodable,
}

impl ClearReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            ClearReason::Restarted => "restarted",
            ClearReason::Lost => "lost",
            ClearReason::Undecodable => "undecodable",
        }
    }
}

/// What the subscriber sends the index's owner, in each replica's order.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineUpdate {
    /// Apply this batch to the replica (`EngineIndex::apply`).
    Batch {
        /// The replica (endpoint) id.
        replica: String,
        /// The publisher's sequence number of the batch.
        seq: u64,
        /// The batch.
        batch: Batch,
    },
    /// Drop what the replica holds (`EngineIndex::clear`).
    Clear {
        /// The replica (endpoint) id.
        replica: String,
        /// Why.
        reason: ClearReason,
    },
}

/// The subscriber's counters, registered in the caller's registry.
#[derive(Debug, Clone)]
pub struct KvEventsMetrics {
    batches: IntCounter,
    events: IntCounterVec,
    decode_errors: IntCounterVec,
    gaps: IntCounter,
    replays: IntCounterVec,
    resets: IntCounterVec,
    unknown_topics: IntCounter,
    blocks: IntCounterVec,
}

impl KvEventsMetrics {
    /// Creates the counters and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str| IntCounter::with_opts(Opts::new(name, help));
        let vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label])
        };
        let m = KvEventsMetrics {
            batches: counter(
                "burst_prefix_kv_event_batches_total",
                "KV-event batches received from the engines (live and replayed)",
            )?,
            events: vec(
                "burst_prefix_kv_events_total",
                "KV events received, by type (unknown: a type this version does not know)",
                "type",
            )?,
            decode_errors: vec(
                "burst_prefix_kv_event_decode_errors_total",
                "KV-event messages that did not decode, by reason",
                "reason",
            )?,
            gaps: counter(
                "burst_prefix_kv_event_gaps_total",
                "Gaps in a publisher's sequence numbers",
            )?,
            replays: vec(
                "burst_prefix_kv_event_replays_total",
                "Replays asked from an engine's replay socket, by outcome (complete, lost: the engine no longer had every batch, failed: no answer)",
                "outcome",
            )?,
            resets: vec(
                "burst_prefix_kv_event_resets_total",
                "A replica's engine blocks dropped, by reason (cleared: AllBlocksCleared, restarted, lost, undecodable)",
                "reason",
            )?,
            unknown_topics: counter(
                "burst_prefix_kv_event_unknown_topics_total",
                "Messages whose topic is not a current endpoint's id (bind topology; dropped)",
            )?,
            blocks: vec(
                "burst_prefix_engine_index_blocks_total",
                "Engine blocks applied to the index, by outcome (stored, removed, removed_unknown, unknown_parent, extra_keys, other_group, malformed, evicted_at_capacity)",
                "outcome",
            )?,
        };
        registry.register(Box::new(m.batches.clone()))?;
        registry.register(Box::new(m.events.clone()))?;
        registry.register(Box::new(m.decode_errors.clone()))?;
        registry.register(Box::new(m.gaps.clone()))?;
        registry.register(Box::new(m.replays.clone()))?;
        registry.register(Box::new(m.resets.clone()))?;
        registry.register(Box::new(m.unknown_topics.clone()))?;
        registry.register(Box::new(m.blocks.clone()))?;
        Ok(m)
    }

    /// Counts what applying a batch to the index did (call with `EngineIndex::apply`'s report);
    /// an `AllBlocksCleared` counts as a reset with reason `cleared`.
    pub fn record_apply(&self, r: &ApplyReport) {
        for (label, n) in [
            ("stored", r.stored),
            ("removed", r.removed),
            ("removed_unknown", r.removed_unknown),
            ("unknown_parent", r.unknown_parent),
            ("extra_keys", r.skipped_extra_keys),
            ("other_group", r.skipped_other_group),
            ("malformed", r.malformed),
            ("evicted_at_capacity", r.evicted_at_capacity),
        ] {
            if n > 0 {
                self.blocks.with_label_values(&[label]).inc_by(n);
            }
        }
        if r.cleared > 0 {
            self.resets
                .with_label_values(&["cleared"])
                .inc_by(r.cleared);
        }
    }

    fn record_batch(&self, batch: &Batch) {
        self.batches.inc();
        for e in &batch.events {
            let t = match e {
                Event::BlockStored(_) => "BlockStored",
                Event::BlockRemoved(_) => "BlockRemoved",
                Event::AllBlocksCleared => "AllBlocksCleared",
                Event::Unknown(_) => "unknown",
            };
            self.events.with_label_values(&[t]).inc();
        }
    }

    /// Batches received so far (live and replayed).
    pub fn batches(&self) -> u64 {
        self.batches.get()
    }

    /// Gaps seen so far.
    pub fn gaps(&self) -> u64 {
        self.gaps.get()
    }

    /// Replays with this outcome so far (`complete`, `lost`, `failed`).
    pub fn replays(&self, outcome: &str) -> u64 {
        self.replays.with_label_values(&[outcome]).get()
    }

    /// Resets with this reason so far (`cleared`, `restarted`, `lost`, `undecodable`).
    pub fn resets(&self, reason: &str) -> u64 {
        self.resets.with_label_values(&[reason]).get()
    }

    /// Events of this type so far (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`, `unknown`).
    pub fn events(&self, kind: &str) -> u64 {
        self.events.with_label_values(&[kind]).get()
    }

    /// Messages that did not decode so far.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

/// Why the subscriber could not start.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The bind endpoint could not be bound.
    #[error("binding {endpoint}: {source}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: zeromq::ZmqError,
    },
    /// The SUB socket refused the subscription.
    #[error("subscribing: {0}")]
    Subscribe(zeromq::ZmqError),
}

/// A running subscriber; dropping it stops every task it started.
#[derive(Debug)]
pub struct KvEventsSubscriber {
    task: JoinHandle<()>,
    bound: Option<String>,
}

impl Drop for KvEventsSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One publisher's ordering state and replay address.
struct Stream {
    replica: String,
    /// Rank 0's replay address (rank r's is derived, as vLLM derives it).
    replay: Option<String>,
    /// One tracker per data-parallel rank: each rank publishes its own sequence.
    trackers: HashMap<i64, SeqTracker>,
}

impl Stream {
    fn new(replica: String, replay: Option<String>) -> Self {
        Stream {
            replica,
            replay,
            trackers: HashMap::new(),
        }
    }
}

/// vLLM's address for data-parallel rank `rank` of a publisher or replay socket configured at
/// `address`: the TCP port plus the rank, or `_dp{rank}` after an `inproc` name (vLLM refuses
/// `ipc` with more than one rank).
pub fn rank_address(address: &str, rank: i64) -> String {
    if rank <= 0 {
        return address.to_owned();
    }
    if address.contains("inproc") {
        return format!("{address}_dp{rank}");
    }
    if address.starts_with("tcp://") {
        if let Some((base, port)) = address.rsplit_once(':') {
            if let Ok(port) = port.parse::<i64>() {
                return format!("{base}:{}", port + rank);
            }
        }
    }
    address.to_owned()
}

/// What the per-publisher handling needs.
struct Ctx {
    config: SubscriberConfig,
    sink: mpsc::Sender<EngineUpdate>,
    metrics: KvEventsMetrics,
}

/// The sink is gone: stop.
struct Closed;

impl KvEventsSubscriber {
    /// Starts the subscriber: binds now (errors are returned) or connects to each endpoint of
    /// `endpoints` as it changes, and sends every update to `sink` in each replica's order. The
    /// tasks end when this value is dropped, when `sink` is, or when the endpoints' sender is.
    /// In the bind topology only topics that are a current endpoint's id are heard.
    pub async fn spawn(
        config: SubscriberConfig,
        endpoints: watch::Receiver<Vec<EngineEndpoint>>,
        sink: mpsc::Sender<EngineUpdate>,
        metrics: KvEventsMetrics,
    ) -> Result<Self, SubscribeError> {
        let topology = config.topology.clone();
        let ctx = Ctx {
            config,
            sink,
            metrics,
        };
        match topology {
            Topology::Bind { endpoint } => {
                let mut socket = zeromq::SubSocket::new();
                // Subscribed before binding: the zeromq crate sends a new peer the
                // subscriptions it remembers when the peer's handshake ends, and a later
                // subscribe() only to peers already listed, so an engine whose connection is
                // accepted between the two would never be subscribed, and a PUB socket sends
                // nothing to a peer that never subscribed. Engines retry their connection
                // every 100 ms while the producer starts, so one lands right after the bind.
                socket
                    .subscribe("")
                    .await
                    .map_err(SubscribeError::Subscribe)?;
                let bound =
                    socket
                        .bind(&endpoint)
                        .await
                        .map_err(|source| SubscribeError::Bind {
                            endpoint: endpoint.clone(),
                            source,
                        })?;
                let task = tokio::spawn(run_bound(socket, endpoints, ctx));
                Ok(KvEventsSubscriber {
                    task,
                    bound: Some(bound.to_string()),
                })
            }
            Topology::Connect { address } => {
                let task = tokio::spawn(run_connecting(address, endpoints, ctx));
                Ok(KvEventsSubscriber { task, bound: None })
            }
        }
    }

    /// The endpoint bound (bind topology), with the port the system chose for port 0.
    pub fn bound_endpoint(&self) -> Option<&str> {
        self.bound.as_deref()
    }
}

/// Frames of a ZMQ message.
fn frames(msg: ZmqMessage) -> Vec<Bytes> {
    msg.into_vec()
}

async fn run_bound(
    mut socket: zeromq::SubSocket,
    mut endpoints: watch::Receiver<Vec<EngineEndpoint>>,
    ctx: Ctx,
) {
    let mut streams: HashMap<String, Stream> = HashMap::new();
    let mut current: HashMap<String, EngineEndpoint> = HashMap::new();
    let refresh = |current: &mut HashMap<String, EngineEndpoint>,
                   streams: &mut HashMap<String, Stream>,
                   list: &[EngineEndpoint]| {
        *current = list.iter().map(|e| (e.id.clone(), e.clone())).collect();
        streams.retain(|id, s| match current.get(id) {
            Some(ep) => {
                s.replay = ctx.config.replay_address.as_deref().map(|t| ep.address(t));
                true
            }
            None => false,
        });
    };
    refresh(&mut current, &mut streams, &endpoints.borrow_and_update());
    loop {
        let msg = tokio::select! {
            changed = endpoints.changed() => {
                if changed.is_err() {
                    return;
                }
                let list = endpoints.borrow_and_update().clone();
                refresh(&mut current, &mut streams, &list);
                continue;
            }
            msg = socket.recv() => msg,
        };
        let frames = match msg {
            Ok(m) => frames(m),
            Err(e) => {
                // A peer went away mid-message; the socket stays usable.
                tracing::debug!(error = %e, "kv events: receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(topic) = frames.first() else {
            continue;
        };
        let topic = String::from_utf8_lossy(topic).into_owned();
        let Some(ep) = current.get(&topic) else {
            ctx.metrics.unknown_topics.inc();
            continue;
        };
        let stream = streams.entry(topic.clone()).or_insert_with(|| {
            Stream::new(
                topic,
                ctx.config.replay_address.as_deref().map(|t| ep.address(t)),
            )
        });
        if handle(&ctx, stream, &frames).await.is_err() {
            return;
        }
    }
}

async fn run_connecting(
    address: String,
    mut endpoints: watch::Receiver<Vec<EngineEndpoint>>,
    ctx: Ctx,
) {
    let ctx = std::sync::Arc::new(ctx);
    let mut tasks: HashMap<String, (EngineEndpoint, JoinHandle<()>)> = HashMap::new();
    // Abort every per-endpoint task when this task ends or is aborted.
    struct AbortAll<'a>(&'a mut HashMap<String, (EngineEndpoint, JoinHandle<()>)>);
    impl Drop for AbortAll<'_> {
        fn drop(&mut self) {
            for (_, (_, t)) in self.0.drain() {
                t.abort();
            }
        }
    }
    let tasks = AbortAll(&mut tasks);
    loop {
        let list = endpoints.borrow_and_update().clone();
        // Gone or changed endpoints: disconnect (the socket is dropped with its task).
        tasks.0.retain(|id, (ep, t)| {
            let keep = list.iter().any(|e| &e.id == id && e == ep) && !t.is_finished();
            if !keep {
                t.abort();
            }
            keep
        });
        for ep in list {
            if tasks.0.contains_key(&ep.id) {
                continue;
            }
            let ctx = ctx.clone();
            let task = tokio::spawn(follow_endpoint(ep.clone(), address.clone(), ctx));
            tasks.0.insert(ep.id.clone(), (ep, task));
        }
        if endpoints.changed().await.is_err() || ctx.sink.is_closed() {
            return;
        }
    }
}

/// How long one attempt to reach an engine's publisher lasts (the zeromq crate retries inside
/// it, from 50 ms up). Attempts repeat for as long as the endpoint is listed: an engine can take
/// minutes to load its model, and the crate's own default gives up after 30 s for good.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// One endpoint's publisher, followed until its task is aborted or the sink closes.
async fn follow_endpoint(ep: EngineEndpoint, template: String, ctx: std::sync::Arc<Ctx>) {
    let address = ep.address(&template);
    let mut options = zeromq::SocketOptions::default();
    options.connect_timeout(CONNECT_ATTEMPT);
    let mut socket = zeromq::SubSocket::with_options(options);
    // Subscribed first, so every connection (and reconnection) is sent the subscription when its
    // handshake ends (see the bind topology).
    if let Err(e) = socket.subscribe("").await {
        tracing::warn!(endpoint = %ep.id, error = %e, "kv events: cannot subscribe");
        return;
    }
    // Retries until the engine's publisher is up (the socket reconnects by itself after that).
    // One connection per data-parallel rank.
    for rank in 0..i64::from(ctx.config.data_parallel_size.max(1)) {
        let address = rank_address(&address, rank);
        let mut attempts = 0u64;
        while let Err(e) = socket.connect(&address).await {
            if attempts == 0 {
                tracing::warn!(endpoint = %ep.id, %address, error = %e, "kv events: cannot connect yet; retrying until the engine's publisher is up");
            } else {
                tracing::debug!(endpoint = %ep.id, %address, error = %e, "kv events: cannot connect yet");
            }
            attempts += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if attempts > 0 {
            tracing::info!(endpoint = %ep.id, %address, attempts, "kv events: connected");
        }
    }
    let mut stream = Stream::new(
        ep.id.clone(),
        ctx.config.replay_address.as_deref().map(|t| ep.address(t)),
    );
    loop {
        let frames = match socket.recv().await {
            Ok(m) => frames(m),
            Err(e) => {
                tracing::debug!(endpoint = %ep.id, error = %e, "kv events: receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if handle(&ctx, &mut stream, &frames).await.is_err() {
            return;
        }
    }
}

/// Handles one live message `[topic, seq, payload]` of one publisher.
async fn handle(ctx: &Ctx, stream: &mut Stream, frames: &[Bytes]) -> Result<(), Closed> {
    let (seq, payload) = match frames {
        [_, seq, payload] => match decode_seq(seq) {
            Ok(s) => (s, payload),
            Err(e) => {
                ctx.metrics
                    .decode_errors
                    .with_label_values(&[e.metric_label()])
                    .inc();
                return Ok(());
            }
        },
        _ => {
            ctx.metrics
                .decode_errors
                .with_label_values(&["frames"])
                .inc();
            return Ok(());
        }
    };
    // Decoded first: the data-parallel rank whose sequence this is lives in the batch.
    let batch = match decode(payload) {
        Ok(batch) => batch,
        Err(e) => return undecodable(ctx, stream, seq, e).await,
    };
    let rank = batch.data_parallel_rank.unwrap_or(0);
    let status = stream.trackers.entry(rank).or_default().observe(seq);
    match status {
        SeqStatus::InOrder => {}
        SeqStatus::First { missed } => {
            if !missed.is_empty() && ctx.config.replay_on_join {
                // Starting from nothing: whatever comes back helps, nothing needs clearing.
                if let Some(batches) = replay(ctx, stream, rank, &missed).await {
                    deliver_all(ctx, stream, batches).await?;
                }
            }
        }
        SeqStatus::Gap { missing } => {
            ctx.metrics.gaps.inc();
            let replayed = replay(ctx, stream, rank, &missing).await;
            let complete = replayed.as_ref().is_some_and(|b| {
                let seqs: Vec<u64> = b.iter().map(|(s, _)| *s).collect();
                judge_replay(&missing, &seqs) == ReplayOutcome::Complete
            });
            if complete {
                deliver_all(ctx, stream, replayed.unwrap_or_default()).await?;
            } else {
                clear(ctx, stream, ClearReason::Lost).await?;
            }
        }
        SeqStatus::Restarted { missed } => {
            clear(ctx, stream, ClearReason::Restarted).await?;
            if !missed.is_empty() {
                if let Some(batches) = replay(ctx, stream, rank, &missed).await {
                    deliver_all(ctx, stream, batches).await?;
                }
            }
        }
    }
    deliver_batch(ctx, stream, seq, batch).await
}

async fn undecodable(
    ctx: &Ctx,
    stream: &Stream,
    seq: u64,
    e: crate::decode::DecodeError,
) -> Result<(), Closed> {
    ctx.metrics
        .decode_errors
        .with_label_values(&[e.metric_label()])
        .inc();
    tracing::warn!(replica = %stream.replica, seq, error = %e, "kv events: undecodable batch");
    clear(ctx, stream, ClearReason::Undecodable).await
}

async fn deliver_batch(ctx: &Ctx, stream: &Stream, seq: u64, batch: Batch) -> Result<(), Closed> {
    ctx.metrics.record_batch(&batch);
    ctx.sink
        .send(EngineUpdate::Batch {
            replica: stream.replica.clone(),
            seq,
            batch,
        })
        .await
        .map_err(|_| Closed)
}

async fn clear(ctx: &Ctx, stream: &Stream, reason: ClearReason) -> Result<(), Closed> {
    ctx.metrics
        .resets
        .with_label_values(&[reason.label()])
        .inc();
    ctx.sink
        .send(EngineUpdate::Clear {
            replica: stream.replica.clone(),
            reason,
        })
        .await
        .map_err(|_| Closed)
}

async fn deliver_all(ctx: &Ctx, stream: &Stream, batches: Vec<(u64, Bytes)>) -> Result<(), Closed> {
    for (seq, payload) in batches {
        deliver(ctx, stream, seq, &payload).await?;
    }
    Ok(())
}

async fn deliver(ctx: &Ctx, stream: &Stream, seq: u64, payload: &[u8]) -> Result<(), Closed> {
    match decode(payload) {
        Ok(batch) => deliver_batch(ctx, stream, seq, batch).await,
        Err(e) => undecodable(ctx, stream, seq, e).await,
    }
}

/// Asks the publisher's replay socket for `range`; the batches in it that came back, in order,
/// or `None` when there is no replay port or no complete answer within the timeout.
async fn replay(
    ctx: &Ctx,
    stream: &Stream,
    rank: i64,
    range: &Range<u64>,
) -> Option<Vec<(u64, Bytes)>> {
    let address = rank_address(stream.replay.as_ref()?, rank);
    let address = &address;
    let config = &ctx.config;
    let result = tokio::time::timeout(
        config.replay_timeout,
        request_replay(address, range, config.max_replay_batches),
    )
    .await;
    let outcome = match result {
        Ok(Ok(batches)) => {
            let seqs: Vec<u64> = batches.iter().map(|(s, _)| *s).collect();
            match judge_replay(range, &seqs) {
                ReplayOutcome::Complete => ("complete", Some(batches)),
                ReplayOutcome::Lost { .. } => ("lost", Some(batches)),
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(replica = %stream.replica, %address, error = %e, "kv events: replay failed");
            ("failed", None)
        }
        Err(_) => {
            tracing::warn!(replica = %stream.replica, %address, "kv events: replay timed out");
            ("failed", None)
        }
    };
    ctx.metrics.replays.with_label_values(&[outcome.0]).inc();
    outcome.1
}

/// vLLM's replay exchange on a fresh DEALER socket; keeps the batches inside `range`.
async fn request_replay(
    address: &str,
    range: &Range<u64>,
    max_batches: usize,
) -> Result<Vec<(u64, Bytes)>, zeromq::ZmqError> {
    let mut socket = zeromq::DealerSocket::new();
    socket.connect(address).await?;
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&range.start.to_be_bytes()));
    socket.send(request).await?;
    let mut out = Vec::new();
    // vLLM answers every buffered batch from `start` on, then the end marker.
    for _ in 0..=max_batches {
        let reply = socket.recv().await?.into_vec();
        // After the empty delimiter: [topic, seq, payload] (vLLM 0.32) or [seq, payload]
        // (earlier versions).
        let (seq, payload) = match reply.as_slice() {
            [_, _, seq, payload] | [_, seq, payload] => (seq, payload),
            _ => continue,
        };
        if seq.as_ref() == [0xff; 8] {
            break;
        }
        let Ok(seq) = decode_seq(seq) else {
            continue;
        };
        if range.contains(&seq) {
            out.push((seq, payload.clone()));
        }
        if seq + 1 >= range.end {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_addresses_follow_vllms_offsets() {
        assert_eq!(rank_address("tcp://*:5557", 0), "tcp://*:5557");
        assert_eq!(
            rank_address("tcp://10.0.0.1:5557", 2),
            "tcp://10.0.0.1:5559"
        );
        assert_eq!(
            rank_address("tcp://[fd00::1]:5557", 1),
            "tcp://[fd00::1]:5558"
        );
        assert_eq!(rank_address("inproc://kv", 1), "inproc://kv_dp1");
        assert_eq!(rank_address("ipc:///run/kv.sock", 1), "ipc:///run/kv.sock");
    }

    #[test]
    fn metrics_register_once_and_count_what_apply_reports() {
        let registry = Registry::new();
        let m = KvEventsMetrics::register(&registry).unwrap();
        assert!(
            KvEventsMetrics::register(&registry).is_err(),
            "names are unique"
        );
        m.record_apply(&ApplyReport {
            stored: 3,
            cleared: 1,
            ..ApplyReport::default()
        });
        assert_eq!(m.blocks.with_label_values(&["stored"]).get(), 3);
        assert_eq!(m.resets("cleared"), 1);
    }
}
