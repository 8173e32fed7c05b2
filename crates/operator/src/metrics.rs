//! Operator metrics, in the operator's own registry.

use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub reconciliations: IntCounterVec,
    pub failures: IntCounterVec,
    pub duration: HistogramVec,
    pub status_writes: IntCounterVec,
    pub leader: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "burst_prefix_operator_reconciliations_total",
                "Reconciliations run",
            ),
            &["result"],
        )
        .unwrap();
        let failures = IntCounterVec::new(
            Opts::new(
                "burst_prefix_operator_reconcile_errors_total",
                "Failed reconciliations by error",
            ),
            &["error"],
        )
        .unwrap();
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "burst_prefix_operator_reconcile_duration_seconds",
                "Time one reconciliation took",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
            &[],
        )
        .unwrap();
        let status_writes = IntCounterVec::new(
            Opts::new(
                "burst_prefix_operator_status_writes_total",
                "Status subresource writes (only when the status changed)",
            ),
            &[],
        )
        .unwrap();
        let leader = IntGauge::new(
            "burst_prefix_operator_leader",
            "1 while this replica holds the leader lease",
        )
        .unwrap();
        for collector in [
            Box::new(reconciliations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(duration.clone()),
            Box::new(status_writes.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(collector).unwrap();
        }
        Metrics {
            registry,
            reconciliations,
            failures,
            duration,
            status_writes,
            leader,
        }
    }
}

impl Metrics {
    /// Times a reconciliation until dropped, so early returns are timed too.
    pub fn timer(&self) -> ReconcileTimer {
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.duration.with_label_values(&[] as &[&str]),
        }
    }

    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

pub struct ReconcileTimer {
    start: Instant,
    histogram: prometheus::Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
