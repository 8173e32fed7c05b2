//! One publisher's messages, in its order: sequence numbers tracked per data-parallel rank
//! ([`crate::sequence`]), a gap replayed from the engine's replay socket ([`super::replay`]) or
//! the replica cleared, a restart cleared, and every batch delivered to the sink.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::ZmqMessage;

use super::config::SubscriberConfig;
use super::metrics::KvEventsMetrics;
use super::replay;
use super::update::{ClearReason, EngineUpdate};
use crate::decode::{decode, decode_seq, Batch};
use crate::endpoints::EngineEndpoint;
use crate::sequence::{judge_replay, ReplayOutcome, SeqStatus, SeqTracker};

/// What the per-publisher handling needs.
pub(super) struct Ctx {
    pub config: SubscriberConfig,
    pub sink: mpsc::Sender<EngineUpdate>,
    pub metrics: KvEventsMetrics,
}

/// The sink is gone: stop.
pub(super) struct Closed;

/// One publisher's ordering state and replay address.
pub(super) struct Publisher {
    replica: String,
    /// Rank 0's replay address (rank r's is derived, as vLLM derives it).
    replay: Option<String>,
    /// One tracker per data-parallel rank: each rank publishes its own sequence.
    trackers: HashMap<i64, SeqTracker>,
}

impl Publisher {
    /// The publisher of `endpoint`'s engine.
    pub(super) fn new(endpoint: &EngineEndpoint, config: &SubscriberConfig) -> Self {
        Publisher {
            replica: endpoint.id.clone(),
            replay: config
                .replay_address
                .as_deref()
                .map(|t| endpoint.address(t)),
            trackers: HashMap::new(),
        }
    }

    /// Follows `endpoint` (its address may have changed).
    pub(super) fn follow(&mut self, endpoint: &EngineEndpoint, config: &SubscriberConfig) {
        self.replay = config
            .replay_address
            .as_deref()
            .map(|t| endpoint.address(t));
    }

    /// The batches in `range` of data-parallel rank `rank`, asked from the replay socket.
    async fn replay(&self, ctx: &Ctx, rank: i64, range: &Range<u64>) -> Option<Vec<(u64, Bytes)>> {
        let address = replay::rank_address(self.replay.as_ref()?, rank);
        replay::replay(&ctx.config, &ctx.metrics, &self.replica, &address, range).await
    }
}

/// Frames of a ZMQ message.
pub(super) fn frames(msg: ZmqMessage) -> Vec<Bytes> {
    msg.into_vec()
}

/// Handles one live message `[topic, seq, payload]` of one publisher.
pub(super) async fn handle(
    ctx: &Ctx,
    publisher: &mut Publisher,
    frames: &[Bytes],
) -> Result<(), Closed> {
    let (seq, payload) = match frames {
        [_, seq, payload] => match decode_seq(seq) {
            Ok(s) => (s, payload),
            Err(e) => {
                ctx.metrics.decode_error(e.metric_label());
                return Ok(());
            }
        },
        _ => {
            ctx.metrics.decode_error("frames");
            return Ok(());
        }
    };
    // Decoded first: the data-parallel rank whose sequence this is lives in the batch.
    let batch = match decode(payload) {
        Ok(batch) => batch,
        Err(e) => return undecodable(ctx, publisher, seq, e).await,
    };
    let rank = batch.data_parallel_rank.unwrap_or(0);
    let status = publisher.trackers.entry(rank).or_default().observe(seq);
    match status {
        SeqStatus::InOrder => {}
        SeqStatus::First { missed } => {
            if !missed.is_empty() && ctx.config.replay_on_join {
                // Starting from nothing: whatever comes back helps, nothing needs clearing.
                if let Some(batches) = publisher.replay(ctx, rank, &missed).await {
                    deliver_all(ctx, publisher, batches).await?;
                }
            }
        }
        SeqStatus::Gap { missing } => {
            ctx.metrics.gap();
            let replayed = publisher.replay(ctx, rank, &missing).await;
            let complete = replayed.as_ref().is_some_and(|b| {
                let seqs: Vec<u64> = b.iter().map(|(s, _)| *s).collect();
                judge_replay(&missing, &seqs) == ReplayOutcome::Complete
            });
            if complete {
                deliver_all(ctx, publisher, replayed.unwrap_or_default()).await?;
            } else {
                clear(ctx, publisher, ClearReason::Lost).await?;
            }
        }
        SeqStatus::Restarted { missed } => {
            clear(ctx, publisher, ClearReason::Restarted).await?;
            if !missed.is_empty() {
                if let Some(batches) = publisher.replay(ctx, rank, &missed).await {
                    deliver_all(ctx, publisher, batches).await?;
                }
            }
        }
    }
    deliver_batch(ctx, publisher, seq, batch).await
}

async fn undecodable(
    ctx: &Ctx,
    publisher: &Publisher,
    seq: u64,
    e: crate::decode::DecodeError,
) -> Result<(), Closed> {
    ctx.metrics.decode_error(e.metric_label());
    tracing::warn!(replica = %publisher.replica, seq, error = %e, "kv events: undecodable batch");
    clear(ctx, publisher, ClearReason::Undecodable).await
}

async fn deliver_batch(
    ctx: &Ctx,
    publisher: &Publisher,
    seq: u64,
    batch: Batch,
) -> Result<(), Closed> {
    ctx.metrics.record_batch(&batch);
    ctx.sink
        .send(EngineUpdate::Batch {
            replica: publisher.replica.clone(),
            seq,
            batch,
        })
        .await
        .map_err(|_| Closed)
}

async fn clear(ctx: &Ctx, publisher: &Publisher, reason: ClearReason) -> Result<(), Closed> {
    ctx.metrics.reset(reason.label());
    ctx.sink
        .send(EngineUpdate::Clear {
            replica: publisher.replica.clone(),
            reason,
        })
        .await
        .map_err(|_| Closed)
}

async fn deliver_all(
    ctx: &Ctx,
    publisher: &Publisher,
    batches: Vec<(u64, Bytes)>,
) -> Result<(), Closed> {
    for (seq, payload) in batches {
        deliver(ctx, publisher, seq, &payload).await?;
    }
    Ok(())
}

async fn deliver(ctx: &Ctx, publisher: &Publisher, seq: u64, payload: &[u8]) -> Result<(), Closed> {
    match decode(payload) {
        Ok(batch) => deliver_batch(ctx, publisher, seq, batch).await,
        Err(e) => undecodable(ctx, publisher, seq, e).await,
    }
}
