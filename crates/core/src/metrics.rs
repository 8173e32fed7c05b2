//! The producer's Prometheus metrics, in its own [`Registry`] (never the global one), served on
//! the admin port as `GET /metrics`. Here the core's own: each request's outcome and wait, the
//! config in force and leadership. The window, the memory and the engine feeds register theirs
//! beside them in the same registry, and so does each front-end (`burst_prefix_upstream_*`,
//! `burst_prefix_epp_*`, `burst_prefix_plans_total`); a front-end's per-endpoint series are
//! dropped with the endpoint through [`Metrics::per_endpoint`].

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// How a request ended (`burst_prefix_requests_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Planned onto a replica.
    Assigned,
    /// Planned, but no replica was chosen (a lone request, no tokens, or not allowed there).
    NoAffinity,
    /// Refused with an error status (bad input, window full, no endpoints, shutting down).
    Rejected,
    /// The client went away before its request was placed; removed from its window.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Assigned,
        Outcome::NoAffinity,
        Outcome::Rejected,
        Outcome::Cancelled,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Assigned => "assigned",
            Outcome::NoAffinity => "no_affinity",
            Outcome::Rejected => "rejected",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// A front-end's series labelled by `endpoint`, dropped for an endpoint the config no longer
/// names (a fleet that churns through pods would otherwise grow `/metrics` without bound).
pub enum EndpointSeries {
    Counters(IntCounterVec),
    /// A gauge's series stays while it is not zero (requests to the endpoint still running).
    Gauges(IntGaugeVec),
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    pub request_wait_seconds: Histogram,
    pub endpoints: IntGauge,
    config_reloads: IntCounterVec,
    /// 1 while this replica leads (always, without leader election), 0 as a follower.
    pub leading: IntGauge,
    per_endpoint: Mutex<Vec<EndpointSeries>>,
    /// The metrics each front-end made, by type.
    front_ends: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "burst_prefix_requests_total",
                "Requests by outcome: assigned, no_affinity, rejected, cancelled",
            ),
            &["outcome"],
        )
        .unwrap();
        let request_wait_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_request_wait_seconds",
                "Time from joining a window to being released with the plan",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .unwrap();
        let endpoints =
            IntGauge::new("burst_prefix_endpoints", "Endpoints in the config in force").unwrap();
        let config_reloads = IntCounterVec::new(
            Opts::new(
                "burst_prefix_config_reloads_total",
                "Config updates by result: accepted, rejected (the last good config stays)",
            ),
            &["result"],
        )
        .unwrap();
        let leading = IntGauge::new(
            "burst_prefix_leader",
            "1 while this producer replica leads (always without --leader-elect), 0 as a follower",
        )
        .unwrap();
        leading.set(1);
        for collector in [
            Box::new(requests.clone()) as Box<dyn Collector>,
            Box::new(request_wait_seconds.clone()),
            Box::new(endpoints.clone()),
            Box::new(config_reloads.clone()),
            Box::new(leading.clone()),
        ] {
            registry.register(collector).unwrap();
        }
        // Every label value exists from the start, so dashboards and tests see zeros.
        for outcome in Outcome::ALL {
            requests.with_label_values(&[outcome.label()]);
        }
        for result in ["accepted", "rejected"] {
            config_reloads.with_label_values(&[result]);
        }
        Metrics {
            registry,
            requests,
            request_wait_seconds,
            endpoints,
            config_reloads,
            leading,
            per_endpoint: Mutex::new(Vec::new()),
            front_ends: Mutex::new(HashMap::new()),
        }
    }

    /// A front-end's own metrics (`T`), made by `make` (which registers them in the registry)
    /// the first time they are asked for: a front-end built twice on one producer shares them.
    pub fn front_end<T: Send + Sync + 'static>(&self, make: impl FnOnce(&Metrics) -> T) -> Arc<T> {
        let mut made = self
            .front_ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = made
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(make(self)) as Arc<dyn Any + Send + Sync>)
            .clone();
        drop(made);
        entry.downcast::<T>().expect("stored under its own type")
    }

    /// Registers a front-end's series labelled by `endpoint` (registered in the registry by the
    /// front-end) for dropping with the endpoint.
    pub fn per_endpoint(&self, series: EndpointSeries) {
        self.per_endpoint
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(series);
    }

    /// Drops the per-endpoint series of endpoints `keep` does not keep (the config no longer
    /// names them); a gauge's stays while it is not zero.
    pub fn retain_endpoints(&self, keep: &dyn Fn(&str) -> bool) {
        let gone = |labels: &[(String, String)]| {
            labels
                .iter()
                .any(|(name, value)| name == "endpoint" && !keep(value))
        };
        let series = self
            .per_endpoint
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for series in series.iter() {
            match series {
                EndpointSeries::Counters(vec) => {
                    for labels in labels_of(vec) {
                        if gone(&labels) {
                            let _ = vec.remove(&by_name(&labels));
                        }
                    }
                }
                EndpointSeries::Gauges(vec) => {
                    for labels in labels_of(vec) {
                        let labels_by_name = by_name(&labels);
                        if gone(&labels) && vec.with(&labels_by_name).get() == 0 {
                            let _ = vec.remove(&labels_by_name);
                        }
                    }
                }
            }
        }
    }

    pub fn request(&self, outcome: Outcome) {
        self.requests.with_label_values(&[outcome.label()]).inc();
    }

    pub fn config_reload(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "rejected" };
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// The registry every metric is in (what `/metrics` serves).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding into memory cannot fail");
        String::from_utf8(buffer).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The label pairs of every series of `vec`.
fn labels_of(vec: &dyn Collector) -> Vec<Vec<(String, String)>> {
    vec.collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|metric| {
            metric
                .get_label()
                .iter()
                .map(|pair| (pair.name().to_string(), pair.value().to_string()))
                .collect()
        })
        .collect()
}

/// Collected label pairs come sorted by name, not in declaration order: removed by name.
fn by_name(labels: &[(String, String)]) -> std::collections::HashMap<&str, &str> {
    labels
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_that_left_lose_their_series_unless_a_gauge_is_not_zero() {
        let metrics = Metrics::new();
        let counters =
            IntCounterVec::new(Opts::new("c_total", "c"), &["endpoint", "class"]).unwrap();
        let gauges = IntGaugeVec::new(Opts::new("g", "g"), &["endpoint"]).unwrap();
        metrics
            .registry()
            .register(Box::new(counters.clone()))
            .unwrap();
        metrics
            .registry()
            .register(Box::new(gauges.clone()))
            .unwrap();
        metrics.per_endpoint(EndpointSeries::Counters(counters.clone()));
        metrics.per_endpoint(EndpointSeries::Gauges(gauges.clone()));
        counters.with_label_values(&["ml/a", "2xx"]).inc();
        counters.with_label_values(&["ml/b", "5xx"]).inc();
        gauges.with_label_values(&["ml/c"]).inc();
        gauges.with_label_values(&["ml/d"]).inc();
        gauges.with_label_values(&["ml/d"]).dec();
        metrics.retain_endpoints(&|endpoint| endpoint == "ml/a");
        let text = metrics.render();
        assert!(text.contains(r#"endpoint="ml/a""#), "{text}");
        assert!(!text.contains(r#"endpoint="ml/b""#), "{text}");
        assert!(
            text.contains(r#"endpoint="ml/c""#),
            "still in flight: {text}"
        );
        assert!(!text.contains(r#"endpoint="ml/d""#), "{text}");
    }

    #[test]
    fn every_fixed_name_is_exposed_from_the_start() {
        let text = Metrics::new().render();
        for line in [
            "burst_prefix_requests_total{outcome=\"assigned\"} 0",
            "burst_prefix_requests_total{outcome=\"no_affinity\"} 0",
            "burst_prefix_requests_total{outcome=\"rejected\"} 0",
            "burst_prefix_requests_total{outcome=\"cancelled\"} 0",
            "burst_prefix_config_reloads_total{result=\"accepted\"} 0",
            "burst_prefix_config_reloads_total{result=\"rejected\"} 0",
            "burst_prefix_endpoints 0",
            "burst_prefix_request_wait_seconds_count 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
