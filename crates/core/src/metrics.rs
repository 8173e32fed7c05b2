//! The producer's Prometheus metrics, in its own [`Registry`] (never the global one), served on
//! the admin port as `GET /metrics`.

use prometheus::core::Collector;

use super::window::seal::SealReason;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// How a `POST /v1/produce` request ended (`burst_prefix_requests_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Planned onto a replica.
    Assigned,
    /// Planned, but no replica was chosen (a lone request, no tokens, or not allowed there).
    NoAffinity,
    /// Refused with an error status (bad input, window full, no endpoints, shutting down).
    Rejected,
    /// The client went away before its window was sealed; removed from the batch.
    Cancelled,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Assigned => "assigned",
            Outcome::NoAffinity => "no_affinity",
            Outcome::Rejected => "rejected",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// How an upstream request of the proxy ended (`burst_prefix_upstream_requests_total{class}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamClass {
    Informational,
    Success,
    Redirection,
    ClientError,
    ServerError,
    /// No answer: refused, timed out, or broken.
    Error,
}

impl UpstreamClass {
    pub fn of(status: u16) -> Self {
        match status {
            100..=199 => UpstreamClass::Informational,
            200..=299 => UpstreamClass::Success,
            300..=399 => UpstreamClass::Redirection,
            400..=499 => UpstreamClass::ClientError,
            _ => UpstreamClass::ServerError,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            UpstreamClass::Informational => "1xx",
            UpstreamClass::Success => "2xx",
            UpstreamClass::Redirection => "3xx",
            UpstreamClass::ClientError => "4xx",
            UpstreamClass::ServerError => "5xx",
            UpstreamClass::Error => "error",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    pub window_size: Histogram,
    pub window_plan_seconds: Histogram,
    pub request_wait_seconds: Histogram,
    units: IntCounterVec,
    pub endpoints: IntGauge,
    config_reloads: IntCounterVec,
    /// Requests in the open window right now (0 when none is open).
    pub window_open_requests: IntGauge,
    windows_sealed: IntCounterVec,
    upstream_requests: IntCounterVec,
    /// From sending a proxied request to its first body byte.
    pub upstream_ttfb_seconds: Histogram,
    upstream_retries: IntCounter,
    upstream_in_flight: IntGaugeVec,
    upstream_cooldowns: IntCounterVec,
    epp_served: IntCounterVec,
    epp_immediate: IntCounterVec,
    /// 1 while this replica leads (always, without leader election), 0 as a follower.
    pub leading: IntGauge,
    plans: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "burst_prefix_requests_total",
                "POST /v1/produce requests by outcome: assigned, no_affinity, rejected, cancelled",
            ),
            &["outcome"],
        )
        .unwrap();
        let window_size = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_window_size",
                "Requests planned per window (cancelled ones excluded)",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0,
            ]),
        )
        .unwrap();
        let window_plan_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_window_plan_seconds",
                "Time to plan one sealed window",
            )
            .buckets(prometheus::exponential_buckets(0.000_01, 4.0, 10).unwrap()),
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
        let units = IntCounterVec::new(
            Opts::new(
                "burst_prefix_units_total",
                "Placement units formed: group (identical prompts) or single (prefix-sharing request)",
            ),
            &["kind"],
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
        let window_open_requests = IntGauge::new(
            "burst_prefix_window_open_requests",
            "Requests waiting in the open window",
        )
        .unwrap();
        let windows_sealed = IntCounterVec::new(
            Opts::new(
                "burst_prefix_windows_sealed_total",
                "Windows sealed, by reason: timer, hints (every hinted group complete), idle, full, shutdown",
            ),
            &["reason"],
        )
        .unwrap();
        let upstream_requests = IntCounterVec::new(
            Opts::new(
                "burst_prefix_upstream_requests_total",
                "Requests the proxy sent to a replica, by endpoint and status class (1xx..5xx, or error: no answer)",
            ),
            &["endpoint", "class"],
        )
        .unwrap();
        let upstream_ttfb_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_upstream_ttfb_seconds",
                "Time from sending a proxied request to a replica to its first body byte",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
        )
        .unwrap();
        let upstream_retries = IntCounter::new(
            "burst_prefix_upstream_retries_total",
            "Proxied requests sent again to the next replica after a refusal (connection refused, 502, 503)",
        )
        .unwrap();
        let upstream_in_flight = IntGaugeVec::new(
            Opts::new(
                "burst_prefix_upstream_in_flight",
                "Proxied requests in flight, by endpoint",
            ),
            &["endpoint"],
        )
        .unwrap();
        let upstream_cooldowns = IntCounterVec::new(
            Opts::new(
                "burst_prefix_upstream_cooldowns_total",
                "Times an endpoint was left out of planning and routing, by endpoint and reason: unreachable (a refused connection), failed_in_a_row (502/503/504 answers in a row)",
            ),
            &["endpoint", "reason"],
        )
        .unwrap();
        let epp_served = IntCounterVec::new(
            Opts::new(
                "burst_prefix_epp_served_total",
                "Requests a gateway reported served (x-gateway-destination-endpoint-served), by endpoint",
            ),
            &["endpoint"],
        )
        .unwrap();
        let epp_immediate = IntCounterVec::new(
            Opts::new(
                "burst_prefix_epp_immediate_responses_total",
                "Requests the endpoint picker answered itself instead of routing them, by HTTP status",
            ),
            &["status"],
        )
        .unwrap();
        let leading = IntGauge::new(
            "burst_prefix_leader",
            "1 while this producer replica leads (always without --leader-elect), 0 as a follower",
        )
        .unwrap();
        leading.set(1);
        let plans = IntCounterVec::new(
            Opts::new(
                "burst_prefix_plans_total",
                "POST /v1/plan batches by result: planned, refused (bad input or too large), abandoned (client gone or shutting down)",
            ),
            &["result"],
        )
        .unwrap();
        for result in ["planned", "refused", "abandoned"] {
            plans.with_label_values(&[result]);
        }
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(window_size.clone()),
            Box::new(window_plan_seconds.clone()),
            Box::new(request_wait_seconds.clone()),
            Box::new(units.clone()),
            Box::new(endpoints.clone()),
            Box::new(config_reloads.clone()),
            Box::new(window_open_requests.clone()),
            Box::new(windows_sealed.clone()),
            Box::new(upstream_requests.clone()),
            Box::new(upstream_ttfb_seconds.clone()),
            Box::new(upstream_retries.clone()),
            Box::new(upstream_in_flight.clone()),
            Box::new(upstream_cooldowns.clone()),
            Box::new(epp_served.clone()),
            Box::new(epp_immediate.clone()),
            Box::new(leading.clone()),
            Box::new(plans.clone()),
        ] {
            registry.register(collector).unwrap();
        }
        // Every label value exists from the start, so dashboards and tests see zeros.
        for outcome in [
            Outcome::Assigned,
            Outcome::NoAffinity,
            Outcome::Rejected,
            Outcome::Cancelled,
        ] {
            requests.with_label_values(&[outcome.label()]);
        }
        for kind in ["group", "single"] {
            units.with_label_values(&[kind]);
        }
        for result in ["accepted", "rejected"] {
            config_reloads.with_label_values(&[result]);
        }
        for reason in SealReason::ALL {
            windows_sealed.with_label_values(&[reason.label()]);
        }
        Metrics {
            registry,
            requests,
            window_size,
            window_plan_seconds,
            request_wait_seconds,
            units,
            endpoints,
            config_reloads,
            window_open_requests,
            windows_sealed,
            upstream_requests,
            upstream_ttfb_seconds,
            upstream_retries,
            upstream_in_flight,
            upstream_cooldowns,
            epp_served,
            epp_immediate,
            leading,
            plans,
        }
    }

    pub fn plan(&self, result: &str) {
        self.plans.with_label_values(&[result]).inc();
    }

    pub fn epp_served(&self, endpoint: &str) {
        self.epp_served.with_label_values(&[endpoint]).inc();
    }

    pub fn epp_immediate(&self, status: u16) {
        self.epp_immediate
            .with_label_values(&[&status.to_string()])
            .inc();
    }

    pub fn upstream_request(&self, endpoint: &str, class: UpstreamClass) {
        self.upstream_requests
            .with_label_values(&[endpoint, class.label()])
            .inc();
    }

    pub fn upstream_retry(&self) {
        self.upstream_retries.inc();
    }

    pub fn upstream_cooldown(&self, endpoint: &str, reason: &str) {
        self.upstream_cooldowns
            .with_label_values(&[endpoint, reason])
            .inc();
    }

    /// Drops the per-endpoint series of endpoints the config no longer names (a fleet that
    /// churns through pods would otherwise grow `/metrics` without bound); an in-flight gauge
    /// stays while requests to its endpoint are still running.
    pub fn retain_endpoints(&self, keep: &dyn Fn(&str) -> bool) {
        fn endpoints_of(vec: &dyn Collector) -> Vec<Vec<(String, String)>> {
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
        let gone = |labels: &[(String, String)]| {
            labels
                .iter()
                .any(|(name, value)| name == "endpoint" && !keep(value))
        };
        // Collected label pairs come sorted by name, not in declaration order: remove by name.
        fn by_name(labels: &[(String, String)]) -> std::collections::HashMap<&str, &str> {
            labels
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect()
        }
        for vec in [
            &self.upstream_requests,
            &self.upstream_cooldowns,
            &self.epp_served,
        ] {
            for labels in endpoints_of(vec) {
                if gone(&labels) {
                    let _ = vec.remove(&by_name(&labels));
                }
            }
        }
        for labels in endpoints_of(&self.upstream_in_flight) {
            let labels_by_name = by_name(&labels);
            if gone(&labels) && self.upstream_in_flight.with(&labels_by_name).get() == 0 {
                let _ = self.upstream_in_flight.remove(&labels_by_name);
            }
        }
    }

    /// The in-flight gauge of one endpoint.
    pub fn upstream_in_flight(&self, endpoint: &str) -> IntGauge {
        self.upstream_in_flight.with_label_values(&[endpoint])
    }

    pub fn window_sealed(&self, reason: SealReason) {
        self.windows_sealed
            .with_label_values(&[reason.label()])
            .inc();
    }

    pub fn request(&self, outcome: Outcome) {
        self.requests.with_label_values(&[outcome.label()]).inc();
    }

    pub fn requests(&self, outcome: Outcome, count: u64) {
        self.requests
            .with_label_values(&[outcome.label()])
            .inc_by(count);
    }

    pub fn units(&self, groups: u64, singles: u64) {
        self.units.with_label_values(&["group"]).inc_by(groups);
        self.units.with_label_values(&["single"]).inc_by(singles);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_that_left_lose_their_series_unless_requests_are_in_flight() {
        let metrics = Metrics::new();
        metrics.upstream_request("ml/a", UpstreamClass::of(200));
        metrics.upstream_request("ml/b", UpstreamClass::of(503));
        metrics.upstream_cooldown("ml/b", "unreachable");
        metrics.epp_served("ml/b");
        metrics.upstream_in_flight("ml/c").inc();
        metrics.upstream_in_flight("ml/d").inc();
        metrics.upstream_in_flight("ml/d").dec();
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
            "burst_prefix_units_total{kind=\"group\"} 0",
            "burst_prefix_units_total{kind=\"single\"} 0",
            "burst_prefix_config_reloads_total{result=\"accepted\"} 0",
            "burst_prefix_config_reloads_total{result=\"rejected\"} 0",
            "burst_prefix_endpoints 0",
            "burst_prefix_window_size_count 0",
            "burst_prefix_window_plan_seconds_count 0",
            "burst_prefix_request_wait_seconds_count 0",
            "burst_prefix_windows_sealed_total{reason=\"hints\"} 0",
            "burst_prefix_upstream_retries_total 0",
            "burst_prefix_upstream_ttfb_seconds_count 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
