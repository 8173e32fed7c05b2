//! Engine load from vLLM's `/metrics`: requests waiting and running, and KV-cache usage, per
//! served model; parsed from Prometheus' text format and scraped on an interval.
//!
//! A replica with several engines (data parallel: an `engine` label) is summed over them for the
//! request counts and averaged for the cache usage. `vllm:gpu_cache_usage_perc` (older vLLM) is
//! read when `vllm:kv_cache_usage_perc` is absent. Both are fractions (0 to 1) despite the name.
//!
//! Each replica is scraped by a task of its own on its own interval, so one replica's slow or
//! huge `/metrics` never delays another's: a scrape reads at most [`MAX_BODY_BYTES`] (more is a
//! failure, `too_large`) and is parsed off the async workers, all within its timeout.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::endpoints::EngineEndpoint;
use crate::exposition::parse_sample;
use crate::speed::{parse_counters, Counters};

/// One served model's load on one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLoad {
    /// The `model_name` label (`None` when the metrics have none).
    pub model: Option<String>,
    /// `vllm:num_requests_waiting`: requests queued, not yet scheduled.
    pub waiting: f64,
    /// `vllm:num_requests_running`: requests in the running batch.
    pub running: f64,
    /// `vllm:kv_cache_usage_perc`: the fraction of KV-cache blocks in use (0 to 1).
    pub kv_cache_usage: f64,
}

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const USAGE: &str = "vllm:kv_cache_usage_perc";
const USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";

/// The load per served model from a `/metrics` text (models in label order; empty when the text
/// has none of the three metrics).
pub fn parse_load(text: &str) -> Vec<EngineLoad> {
    #[derive(Default)]
    struct Acc {
        waiting: f64,
        running: f64,
        usage: Vec<f64>,
        usage_old: Vec<f64>,
    }
    let mut by_model: BTreeMap<Option<String>, Acc> = BTreeMap::new();
    for line in text.lines() {
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        if ![WAITING, RUNNING, USAGE, USAGE_OLD].contains(&name) || !value.is_finite() {
            continue;
        }
        let model = labels
            .into_iter()
            .find(|(k, _)| k == "model_name")
            .map(|(_, v)| v);
        let acc = by_model.entry(model).or_default();
        match name {
            WAITING => acc.waiting += value,
            RUNNING => acc.running += value,
            USAGE => acc.usage.push(value),
            _ => acc.usage_old.push(value),
        }
    }
    by_model
        .into_iter()
        .map(|(model, acc)| {
            let usage = if acc.usage.is_empty() {
                acc.usage_old
            } else {
                acc.usage
            };
            let kv_cache_usage = if usage.is_empty() {
                0.0
            } else {
                usage.iter().sum::<f64>() / usage.len() as f64
            };
            EngineLoad {
                model,
                waiting: acc.waiting,
                running: acc.running,
                kv_cache_usage,
            }
        })
        .collect()
}

/// The most of a `/metrics` answer a scrape reads: vLLM's is tens of kilobytes.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// No answer (read and parsed) within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// An answer longer than [`MAX_BODY_BYTES`].
    #[error("an answer longer than {0} bytes")]
    TooLarge(usize),
    /// The request failed (connection, body).
    #[error("request: {0}")]
    Http(#[from] reqwest::Error),
    /// An answer other than 200.
    #[error("status {0}")]
    Status(u16),
    /// A 200 without any of vLLM's load metrics (not a vLLM server?).
    #[error("no vLLM load metrics in the answer")]
    NoMetrics,
}

impl ScrapeError {
    /// A short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::TooLarge(_) => "too_large",
            ScrapeError::Http(_) => "http",
            ScrapeError::Status(_) => "status",
            ScrapeError::NoMetrics => "unparsable",
        }
    }

    /// Every label [`ScrapeError::metric_label`] gives, and the learner's rejections.
    pub const LABELS: [&'static str; 6] = [
        "timeout",
        "too_large",
        "http",
        "status",
        "unparsable",
        "rejected_sample",
    ];
}

/// Scrapes one `/metrics` URL within `timeout` (read, at most [`MAX_BODY_BYTES`], and parsed
/// off the async workers) and parses the load, and the counters its speed is learned from
/// (`crate::speed`).
pub async fn scrape_load(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<(Vec<EngineLoad>, Counters), ScrapeError> {
    let scrape = async {
        let mut resp = client.get(url).send().await?;
        if !resp.status().is_success() {
            return Err(ScrapeError::Status(resp.status().as_u16()));
        }
        if resp
            .content_length()
            .is_some_and(|length| length > MAX_BODY_BYTES as u64)
        {
            return Err(ScrapeError::TooLarge(MAX_BODY_BYTES));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ScrapeError::TooLarge(MAX_BODY_BYTES));
            }
            body.extend_from_slice(&chunk);
        }
        let parsed = tokio::task::spawn_blocking(move || {
            let text = String::from_utf8_lossy(&body);
            (parse_load(&text), parse_counters(&text))
        })
        .await
        .map_err(|_| ScrapeError::NoMetrics)?;
        Ok(parsed)
    };
    let (load, counters) = tokio::time::timeout(timeout, scrape)
        .await
        .map_err(|_| ScrapeError::Timeout(timeout))??;
    if load.is_empty() {
        return Err(ScrapeError::NoMetrics);
    }
    Ok((load, counters))
}

/// How the scraper runs.
#[derive(Debug, Clone)]
pub struct LoadScraperConfig {
    /// Time between two rounds of scrapes.
    pub interval: Duration,
    /// The most one scrape may take.
    pub timeout: Duration,
    /// The path scraped on each endpoint's HTTP port.
    pub path: String,
}

impl Default for LoadScraperConfig {
    /// Every second, 500 ms per scrape, `/metrics`.
    fn default() -> Self {
        LoadScraperConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            path: "/metrics".into(),
        }
    }
}

/// One scrape's result for one replica.
#[derive(Debug)]
pub struct LoadReport {
    /// The replica (endpoint) id.
    pub replica: String,
    /// Its load per model and its counters, or why they could not be read.
    pub load: Result<(Vec<EngineLoad>, Counters), ScrapeError>,
}

/// Scrapes every endpoint of `endpoints`, each on its own interval by a task of its own (one
/// replica's slow or huge answer never delays another's), and sends one [`LoadReport`] per
/// scrape to `sink`. Follows the endpoints as they change; stops when `sink` or the endpoints'
/// sender is dropped, or when the handle is aborted (its per-endpoint tasks with it).
pub fn spawn_load_scraper(
    config: LoadScraperConfig,
    mut endpoints: watch::Receiver<Vec<EngineEndpoint>>,
    sink: mpsc::Sender<LoadReport>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut scrapers = Scrapers(HashMap::new());
        loop {
            let current = endpoints.borrow_and_update().clone();
            scrapers
                .0
                .retain(|id, (endpoint, _)| current.iter().any(|e| &e.id == id && e == endpoint));
            for endpoint in current {
                if scrapers.0.contains_key(&endpoint.id) {
                    continue;
                }
                let task = tokio::spawn(scrape_endpoint(
                    client.clone(),
                    config.clone(),
                    endpoint.clone(),
                    sink.clone(),
                ));
                scrapers
                    .0
                    .insert(endpoint.id.clone(), (endpoint, Abort(task)));
            }
            tokio::select! {
                changed = endpoints.changed() => if changed.is_err() { return },
                _ = sink.closed() => return,
            }
        }
    })
}

/// The per-endpoint scrapers, stopped when dropped.
struct Scrapers(HashMap<String, (EngineEndpoint, Abort)>);

/// A task aborted when its handle is dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One endpoint's scrapes, one each interval, until the sink closes.
async fn scrape_endpoint(
    client: reqwest::Client,
    config: LoadScraperConfig,
    endpoint: EngineEndpoint,
    sink: mpsc::Sender<LoadReport>,
) {
    let url = endpoint.http_url(&config.path);
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let report = LoadReport {
            replica: endpoint.id.clone(),
            load: scrape_load(&client, &url, config.timeout).await,
        };
        if sink.send(report).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:num_requests_waiting{model_name="other \"q\"",engine="0"} 7 1700000000000
vllm:gpu_cache_usage_perc{model_name="other \"q\""} 0.5
vllm:prompt_tokens_total{model_name="tiny"} 1234.0
garbage line {{{
"#;

    #[test]
    fn load_is_summed_over_engines_per_model_and_usage_averaged() {
        let load = parse_load(VLLM);
        assert_eq!(
            load,
            vec![
                EngineLoad {
                    model: Some("other \"q\"".into()),
                    waiting: 7.0,
                    running: 0.0,
                    kv_cache_usage: 0.5,
                },
                EngineLoad {
                    model: Some("tiny".into()),
                    waiting: 2.0,
                    running: 4.0,
                    kv_cache_usage: 0.5,
                },
            ]
        );
    }

    #[test]
    fn samples_parse_with_escapes_and_bad_lines_are_skipped() {
        let (name, labels, v) = parse_sample(r#"a_b{x="1\\2",y="\n"} -Inf"#).unwrap();
        assert_eq!(name, "a_b");
        assert_eq!(
            labels,
            vec![("x".into(), "1\\2".into()), ("y".into(), "\n".into())]
        );
        assert_eq!(v, f64::NEG_INFINITY);
        assert_eq!(parse_sample("plain 4").unwrap().2, 4.0);
        for bad in ["# c", "", "x{a=\"1\"", "x{a=1} 2", "x 1e", "x{a=\"1\"}"] {
            assert!(parse_sample(bad).is_none(), "{bad:?}");
        }
        assert!(parse_load("nothing here 1").is_empty());
    }
}
