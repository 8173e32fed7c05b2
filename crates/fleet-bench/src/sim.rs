//! llm-d-inference-sim replicas: started with the flags of their class (bench/fleet/fleet.yaml,
//! [`crate::fleet`]), each on a port of its own, and their own metrics read back: the prefix
//! cache's hits and queries, and the histograms of time to first token, queue time and
//! end-to-end latency.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use burst_prefix_engine_bench::engine::wait_healthy;
use burst_prefix_engine_bench::metrics;
use burst_prefix_engine_bench::process::Process;
use serde::Serialize;
use tokio::process::Command;

use crate::fleet::{FleetConfig, SimLatencies};

/// The model every replica serves, and every request names.
pub const MODEL: &str = "sim-llama-3.1-8b";

/// How the replicas of one run are started.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// The llm-d-inference-sim binary (bench/fleet/install-sim.sh --print-bin).
    pub binary: PathBuf,
    pub fleet: FleetConfig,
    /// Every latency is multiplied by this (1: the published profile's own times).
    pub time_scale: f64,
    /// Seeds each replica's random generator (with its index).
    pub seed: u64,
}

/// One running replica.
pub struct SimReplica {
    pub index: usize,
    /// Its class in [`FleetConfig::classes`].
    pub class: usize,
    pub port: u16,
    process: Process,
}

impl SimReplica {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn group(&self) -> Option<u32> {
        self.process.group()
    }
}

/// A Go duration of `us` microseconds (Go's `time.ParseDuration` takes fractions).
fn go_duration(us: f64) -> String {
    format!("{:.3}us", us.max(0.0))
}

/// The command line of replica `index` of class `class`.
fn command(options: &SimOptions, index: usize, class: usize, port: u16) -> Command {
    let fleet = &options.fleet;
    let SimLatencies {
        prefill_overhead_us,
        prefill_per_token_us,
        inter_token_latency_us,
        time_factor_under_load,
    } = fleet.classes[class].latencies(fleet.max_num_seqs);
    let scale = options.time_scale;
    let mut command = Command::new(&options.binary);
    command
        .args(["--port", &port.to_string(), "--model", MODEL])
        // Never the model hub: the simulator's own tokenizer (one token per word).
        .arg("--force-dummy-tokenizer")
        .args(["--mode", "random"])
        .args(["--seed", &(options.seed * 1_000 + index as u64).to_string()])
        .args(["--max-num-seqs", &fleet.max_num_seqs.to_string()])
        .args([
            "--max-waiting-queue-length",
            &fleet.max_waiting_queue_length.to_string(),
        ])
        .args(["--max-model-len", "32768"])
        .args(["--latency-calculator", "per-token"])
        .args([
            "--prefill-overhead",
            &go_duration(prefill_overhead_us * scale),
        ])
        .args([
            "--prefill-time-per-token",
            &go_duration(prefill_per_token_us * scale),
        ])
        .args([
            "--inter-token-latency",
            &go_duration(inter_token_latency_us * scale),
        ])
        .args([
            "--time-factor-under-load",
            &format!("{time_factor_under_load:.6}"),
        ])
        .args(["--enable-kvcache", "--kv-cache-size"])
        .arg(fleet.kv_cache_blocks.to_string())
        .args(["--block-size", &fleet.block_size.to_string()])
        .args(["--hash-seed", "42"])
        // The KV cache needs the pod's address (its events' topic, kv@<ip>:<port>@<model>).
        .env("POD_IP", "127.0.0.1")
        .env("HF_HUB_OFFLINE", "1");
    // One thread each: a replica mostly sleeps, and with 2 per replica the Go runtime's
    // spinning cost 28% more CPU per request (9.8 ms against 7.7 ms on 512 RL requests).
    command.env("GOMAXPROCS", "1");
    command
}

/// Starts the fleet's `count` replicas and waits until every one answers `GET /health`.
pub async fn start(
    options: &SimOptions,
    count: usize,
    log_dir: &Path,
    client: &reqwest::Client,
) -> anyhow::Result<Vec<SimReplica>> {
    std::fs::create_dir_all(log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;
    let classes = options.fleet.assign(count);
    let mut replicas = Vec::with_capacity(count);
    for (index, &class) in classes.iter().enumerate() {
        let port = crate::netns::next_port()?;
        let log = log_dir.join(format!("sim-{index}.log"));
        let process = Process::start(command(options, index, class, port), &log)?;
        replicas.push(SimReplica {
            index,
            class,
            port,
            process,
        });
    }
    for replica in &mut replicas {
        let url = format!("{}/health", replica.url());
        wait_healthy(&mut replica.process, &url, client, Duration::from_secs(60))
            .await
            .with_context(|| format!("simulator replica {}", replica.index))?;
    }
    Ok(replicas)
}

/// Stops every replica, all at once.
pub async fn stop(replicas: Vec<SimReplica>) {
    futures::future::join_all(
        replicas
            .into_iter()
            .map(|r| r.process.stop(Duration::from_secs(5))),
    )
    .await;
}

/// A histogram's cumulative buckets, sum and count.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Histogram {
    fn read(text: &str, name: &str) -> Histogram {
        Histogram {
            buckets: metrics::buckets(text, name),
            sum: metrics::sum(text, &format!("{name}_sum"), &[]).unwrap_or(0.0),
            count: metrics::sum(text, &format!("{name}_count"), &[]).unwrap_or(0.0),
        }
    }

    fn add(&mut self, other: &Histogram) {
        for &(bound, count) in &other.buckets {
            match self.buckets.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, c)) => *c += count,
                None => self.buckets.push((bound, count)),
            }
        }
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.sum += other.sum;
        self.count += other.count;
    }

    /// What was observed between `earlier` and `self`.
    fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(bound, count)| {
                    let before = earlier
                        .buckets
                        .iter()
                        .find(|(b, _)| *b == bound)
                        .map_or(0.0, |(_, c)| *c);
                    (bound, count - before)
                })
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// The mean, in seconds (NaN when empty).
    pub fn mean(&self) -> f64 {
        self.sum / self.count
    }

    /// The `q`-quantile (0..1) by linear interpolation inside its bucket, as Prometheus's
    /// `histogram_quantile` does: only as fine as the buckets.
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.buckets.last().map_or(0.0, |b| b.1);
        if total <= 0.0 {
            return f64::NAN;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(bound, count) in &self.buckets {
            if count >= rank {
                if bound.is_infinite() {
                    return lower.0;
                }
                let within = count - lower.1;
                let fraction = if within > 0.0 {
                    (rank - lower.1) / within
                } else {
                    1.0
                };
                return lower.0 + (bound - lower.0) * fraction;
            }
            lower = (bound, count);
        }
        lower.0
    }
}

/// The fleet's own figures, summed over its replicas.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimTotals {
    /// `vllm:prefix_cache_hits_total` and `_queries_total`, in tokens.
    pub prefix_cache_hits: f64,
    pub prefix_cache_queries: f64,
    pub requests_finished: f64,
    pub generation_tokens: f64,
    /// `vllm:time_to_first_token_seconds`: the simulated prefill alone (without the queue).
    pub ttft: Histogram,
    /// `vllm:request_queue_time_seconds`: waiting for one of `maxNumSeqs` places.
    pub queue: Histogram,
    /// `vllm:e2e_request_latency_seconds`: from arrival (queue included) to the last token.
    pub e2e: Histogram,
    /// Σ of the prefill and decode times the latency model asked for (its samples:
    /// `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`), and Σ of the
    /// times the replicas really took for them (`vllm:request_prefill_time_seconds`,
    /// `vllm:request_decode_time_seconds`): a replica starved of CPU sleeps longer than asked.
    pub modelled_prefill_s: f64,
    pub actual_prefill_s: f64,
    pub modelled_decode_s: f64,
    pub actual_decode_s: f64,
    /// Requests each replica finished.
    pub per_replica_requests: Vec<f64>,
}

impl SimTotals {
    /// The totals of the replicas' `/metrics` texts.
    pub fn read(texts: &[String]) -> SimTotals {
        let mut totals = SimTotals::default();
        for text in texts {
            let counter = |name: &str| metrics::sum(text, name, &[]).unwrap_or(0.0);
            totals.prefix_cache_hits += counter("vllm:prefix_cache_hits_total");
            totals.prefix_cache_queries += counter("vllm:prefix_cache_queries_total");
            let finished = counter("vllm:request_success_total");
            totals.requests_finished += finished;
            totals.per_replica_requests.push(finished);
            totals.generation_tokens += counter("vllm:generation_tokens_total");
            totals
                .ttft
                .add(&Histogram::read(text, "vllm:time_to_first_token_seconds"));
            totals
                .queue
                .add(&Histogram::read(text, "vllm:request_queue_time_seconds"));
            totals
                .e2e
                .add(&Histogram::read(text, "vllm:e2e_request_latency_seconds"));
            totals.modelled_prefill_s += counter("vllm:time_to_first_token_seconds_sum");
            totals.actual_prefill_s += counter("vllm:request_prefill_time_seconds_sum");
            totals.modelled_decode_s += counter("vllm:inter_token_latency_seconds_sum");
            totals.actual_decode_s += counter("vllm:request_decode_time_seconds_sum");
        }
        totals
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &SimTotals) -> SimTotals {
        SimTotals {
            prefix_cache_hits: self.prefix_cache_hits - earlier.prefix_cache_hits,
            prefix_cache_queries: self.prefix_cache_queries - earlier.prefix_cache_queries,
            requests_finished: self.requests_finished - earlier.requests_finished,
            generation_tokens: self.generation_tokens - earlier.generation_tokens,
            ttft: self.ttft.since(&earlier.ttft),
            queue: self.queue.since(&earlier.queue),
            e2e: self.e2e.since(&earlier.e2e),
            modelled_prefill_s: self.modelled_prefill_s - earlier.modelled_prefill_s,
            actual_prefill_s: self.actual_prefill_s - earlier.actual_prefill_s,
            modelled_decode_s: self.modelled_decode_s - earlier.modelled_decode_s,
            actual_decode_s: self.actual_decode_s - earlier.actual_decode_s,
            per_replica_requests: self
                .per_replica_requests
                .iter()
                .zip(
                    earlier
                        .per_replica_requests
                        .iter()
                        .chain(std::iter::repeat(&0.0)),
                )
                .map(|(now, before)| now - before)
                .collect(),
        }
    }

    /// How much longer the replicas took for their prefills and decodes than the latency model
    /// asked (1.0: exactly; the time each actually spent over the time it was told to sleep).
    pub fn slowdown(&self) -> (f64, f64) {
        (
            self.actual_prefill_s / self.modelled_prefill_s,
            self.actual_decode_s / self.modelled_decode_s,
        )
    }

    /// Hits over queries (NaN when nothing was queried).
    pub fn hit_rate(&self) -> f64 {
        self.prefix_cache_hits / self.prefix_cache_queries
    }
}

/// Every replica's `/metrics`, read at once.
pub async fn scrape(
    replicas: &[SimReplica],
    client: &reqwest::Client,
) -> anyhow::Result<SimTotals> {
    let texts = futures::future::try_join_all(replicas.iter().map(|replica| async move {
        let url = format!("{}/metrics", replica.url());
        let response = client
            .get(&url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        anyhow::Ok(response.error_for_status()?.text().await?)
    }))
    .await?;
    Ok(SimTotals::read(&texts))
}

/// Waits until the replicas have counted `expected` more finished requests than `before` (they
/// count a request just after its answer), at most `timeout`; returns the totals since.
pub async fn settled(
    replicas: &[SimReplica],
    before: &SimTotals,
    expected: f64,
    client: &reqwest::Client,
    timeout: Duration,
) -> anyhow::Result<SimTotals> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let since = scrape(replicas, client).await?.since(before);
        if since.requests_finished >= expected || std::time::Instant::now() >= deadline {
            return Ok(since);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"vllm:prefix_cache_hits_total{model_name="m"} 300
vllm:prefix_cache_queries_total{model_name="m"} 400
vllm:request_success_total{finished_reason="length",model_name="m"} 4
vllm:generation_tokens_total{model_name="m"} 40
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.01"} 2
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.02"} 4
vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 4
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.05
vllm:time_to_first_token_seconds_count{model_name="m"} 4
vllm:request_prefill_time_seconds_sum{model_name="m"} 0.06
vllm:inter_token_latency_seconds_sum{model_name="m"} 0.5
vllm:request_decode_time_seconds_sum{model_name="m"} 0.6
"#;

    #[test]
    fn totals_add_up_the_replicas_and_subtract_the_earlier_reading() {
        let earlier = SimTotals::read(&[METRICS.to_string()]);
        let now = SimTotals::read(&[METRICS.to_string(), METRICS.to_string()]);
        assert_eq!(now.prefix_cache_hits, 600.0);
        assert_eq!(now.hit_rate(), 0.75);
        assert_eq!(now.ttft.count, 8.0);
        assert_eq!(
            now.ttft.buckets,
            vec![(0.01, 4.0), (0.02, 8.0), (f64::INFINITY, 8.0)]
        );
        let since = now.since(&earlier);
        assert_eq!(since.requests_finished, 4.0);
        assert_eq!(since.per_replica_requests, vec![0.0, 4.0]);
        assert_eq!(since.ttft.buckets[1], (0.02, 4.0));
        assert!((since.ttft.mean() - 0.0125).abs() < 1e-9);
        let (prefill, decode) = since.slowdown();
        assert!((prefill - 1.2).abs() < 1e-9 && (decode - 1.2).abs() < 1e-9);
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        let histogram = Histogram {
            buckets: vec![(0.01, 2.0), (0.02, 4.0), (f64::INFINITY, 4.0)],
            sum: 0.05,
            count: 4.0,
        };
        assert!((histogram.quantile(0.5) - 0.01).abs() < 1e-12);
        assert!((histogram.quantile(0.75) - 0.015).abs() < 1e-12);
        assert!(Histogram::default().quantile(0.5).is_nan());
    }

    #[test]
    fn durations_are_whole_microseconds() {
        assert_eq!(go_duration(5985.16), "5985.160us");
        assert_eq!(go_duration(19.003), "19.003us");
    }
}
