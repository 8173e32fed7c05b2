//! The subscriber's counters, registered in the caller's registry.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::decode::{Batch, Event};
use crate::index::ApplyReport;

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

    pub(super) fn record_batch(&self, batch: &Batch) {
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

    pub(super) fn decode_error(&self, reason: &str) {
        self.decode_errors.with_label_values(&[reason]).inc();
    }

    pub(super) fn gap(&self) {
        self.gaps.inc();
    }

    pub(super) fn replay(&self, outcome: &str) {
        self.replays.with_label_values(&[outcome]).inc();
    }

    pub(super) fn reset(&self, reason: &str) {
        self.resets.with_label_values(&[reason]).inc();
    }

    pub(super) fn unknown_topic(&self) {
        self.unknown_topics.inc();
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

#[cfg(test)]
mod tests {
    use super::*;

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
