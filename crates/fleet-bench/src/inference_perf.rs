//! inference-perf (bench/fleet/inference-perf/setup.sh), the field's load generator: its config
//! written from the bench's workload, its run watched (each stage's start and end, from its log,
//! so that CPU and the simulators' metrics can be read at the stage's bounds), and its
//! per-stage reports read back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use burst_prefix_engine_bench::process::Process;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::process::Command;

use crate::sim::MODEL;

/// A Poisson sweep over shared system prompts (`shared_prefix`): `groups` system prompts,
/// `prompts_per_group` questions each, one stage per offered rate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedPrefixSweep {
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_prompt_tokens: usize,
    pub question_tokens: usize,
    pub output_tokens: usize,
    /// Requests per second, one stage each, in order.
    pub rates: Vec<f64>,
    pub stage_seconds: u32,
}

/// Multi-turn conversations on a shared system prompt (`conversation_replay`), closed loop:
/// `conversations` at once, each sending its next turn when its last is answered.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversations {
    pub conversations: usize,
    pub turns: usize,
    pub shared_system_prompt_tokens: usize,
    pub own_system_prompt_tokens: usize,
    pub input_tokens_per_turn: usize,
    pub output_tokens_per_turn: usize,
    /// Requests in all (bounds the run).
    pub requests: usize,
}

/// What inference-perf sends.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Load {
    SharedPrefix(SharedPrefixSweep),
    Conversations(Conversations),
}

impl Load {
    pub fn name(&self) -> &'static str {
        match self {
            Load::SharedPrefix(_) => "shared-prefix",
            Load::Conversations(_) => "conversations",
        }
    }

    /// Each stage's offered rate (requests per second; NaN for a closed loop).
    pub fn rates(&self) -> Vec<f64> {
        match self {
            Load::SharedPrefix(sweep) => sweep.rates.clone(),
            Load::Conversations(_) => vec![f64::NAN],
        }
    }

    /// The inference-perf config (YAML) that sends this load to `url`.
    pub fn config(&self, url: &str, tokenizer: &Path, reports: &Path, seed: u64) -> String {
        let fixed =
            |n: usize| json!({"type": "fixed", "mean": n, "min": n, "max": n, "std_dev": 0});
        let (data, load) = match self {
            Load::SharedPrefix(s) => (
                json!({
                    "type": "shared_prefix",
                    "shared_prefix": {
                        "num_groups": s.groups,
                        "num_prompts_per_group": s.prompts_per_group,
                        "system_prompt_len": s.system_prompt_tokens,
                        "question_len": s.question_tokens,
                        "output_len": s.output_tokens,
                        "seed": seed,
                    },
                }),
                json!({
                    "type": "poisson",
                    "interval": 1,
                    "stages": s.rates.iter().map(|rate| json!({
                        "rate": rate, "duration": s.stage_seconds,
                    })).collect::<Vec<_>>(),
                }),
            ),
            Load::Conversations(c) => (
                json!({
                    "type": "conversation_replay",
                    "conversation_replay": {
                        "seed": seed,
                        "num_conversations": c.conversations,
                        "shared_system_prompt_len": c.shared_system_prompt_tokens,
                        "dynamic_system_prompt_len": fixed(c.own_system_prompt_tokens),
                        "turns_per_conversation": fixed(c.turns),
                        "input_tokens_per_turn": fixed(c.input_tokens_per_turn),
                        "output_tokens_per_turn": fixed(c.output_tokens_per_turn),
                        "max_model_len": 32768,
                    },
                }),
                json!({
                    "type": "concurrent",
                    "stages": [{"num_requests": c.requests, "concurrency_level": c.conversations}],
                }),
            ),
        };
        let mut load = load;
        // Two worker processes (the machine's cores); enough concurrency for any stage; every
        // request bounded in time.
        load["num_workers"] = json!(2);
        load["worker_max_concurrency"] = json!(2000);
        load["request_timeout"] = json!(300);
        load["base_seed"] = json!(seed);
        let config = json!({
            "api": {
                "type": "completion",
                "streaming": true,
                // vllm-router's consistent_hash keys a conversation by it.
                "session_id_header_key": "X-Session-ID",
            },
            "data": data,
            "load": load,
            "server": {
                "type": "vllm",
                "model_name": MODEL,
                "base_url": url,
                "ignore_eos": true,
            },
            "tokenizer": {"pretrained_model_name_or_path": tokenizer.display().to_string()},
            "report": {
                "request_lifecycle": {
                    "summary": true,
                    "per_stage": true,
                    "per_request": false,
                    "use_server_output_tokens": true,
                    "percentiles": [50, 90, 99],
                },
            },
            "storage": {"local_storage": {"path": reports.display().to_string()}},
        });
        serde_yaml::to_string(&config).expect("a config serializes")
    }
}

/// A stage's bound, as inference-perf logged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageEvent {
    Started(usize),
    Ended(usize),
}

/// The stage events in one line of inference-perf's log.
fn stage_event(line: &str) -> Option<StageEvent> {
    let rest = &line[line.find("Stage ")? + "Stage ".len()..];
    let (number, rest) = rest.split_once(" - ")?;
    let stage = number.trim().parse().ok()?;
    if rest.starts_with("run started") {
        Some(StageEvent::Started(stage))
    } else if rest.starts_with("run completed") || rest.starts_with("run failed") {
        Some(StageEvent::Ended(stage))
    } else {
        None
    }
}

/// What is done at each stage's bound, while inference-perf runs.
pub trait StageWatcher {
    /// `group`: inference-perf's process group (its workers are in it).
    fn on_stage(
        &mut self,
        event: StageEvent,
        group: Option<u32>,
    ) -> impl std::future::Future<Output = anyhow::Result<()>>;
}

/// Runs inference-perf with `config` (written to `dir`), telling `watcher` of each stage's start
/// and end as they appear in its log, and stops it (its whole process group) after `limit`. Its
/// log is `dir/inference-perf.log`; its reports go where the config says.
pub async fn run(
    python: &Path,
    config: &str,
    dir: &Path,
    limit: Duration,
    watcher: &mut impl StageWatcher,
) -> anyhow::Result<()> {
    let config_path: PathBuf = dir.join("inference-perf.yaml");
    std::fs::write(&config_path, config)?;
    let log = dir.join("inference-perf.log");
    let mut command = Command::new(python);
    command
        .args(["-m", "inference_perf.main", "--config_file"])
        .arg(&config_path)
        // Never a model hub: the tokenizer is a local directory.
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("NO_PROXY", "*")
        .env("PYTHONUNBUFFERED", "1");
    let mut process = Process::start(command, &log)?;
    let deadline = Instant::now() + limit;
    let mut read = 0;
    loop {
        let exited = process.exited()?;
        let text = std::fs::read(&log).unwrap_or_default();
        // Whole lines only: the last may still be written.
        let end = if exited.is_some() {
            text.len()
        } else {
            text[read..]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(read, |at| read + at + 1)
        };
        for line in String::from_utf8_lossy(&text[read..end]).lines() {
            if let Some(event) = stage_event(line) {
                watcher.on_stage(event, process.group()).await?;
            }
        }
        read = end;
        if let Some(status) = exited {
            if !status.success() {
                bail!("inference-perf exited with {status}; see {}", log.display());
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            process.stop(Duration::from_secs(5)).await;
            bail!(
                "inference-perf still ran after {limit:?}; stopped (see {})",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One stage as inference-perf reported it (times in milliseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageReport {
    pub stage: usize,
    pub requested_rate: f64,
    pub achieved_rate: f64,
    pub successes: u64,
    pub failures: u64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub latency_mean_ms: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
}

fn stage_report(stage: usize, report: &Value) -> StageReport {
    let number = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let ms = |v: &Value| number(v) * 1e3;
    let latency = &report["successes"]["latency"];
    let ttft = &latency["time_to_first_token"];
    let e2e = &latency["request_latency"];
    StageReport {
        stage,
        requested_rate: number(&report["load_summary"]["requested_rate"]),
        achieved_rate: number(&report["load_summary"]["achieved_rate"]),
        successes: report["successes"]["count"].as_u64().unwrap_or(0),
        failures: report["failures"]["count"].as_u64().unwrap_or(0),
        ttft_mean_ms: ms(&ttft["mean"]),
        ttft_p50_ms: ms(&ttft["median"]),
        ttft_p99_ms: ms(&ttft["p99"]),
        latency_mean_ms: ms(&e2e["mean"]),
        latency_p50_ms: ms(&e2e["median"]),
        latency_p99_ms: ms(&e2e["p99"]),
        output_tokens_per_s: number(&report["successes"]["throughput"]["output_tokens_per_sec"]),
        requests_per_s: number(&report["successes"]["throughput"]["requests_per_sec"]),
    }
}

/// Every `stage_N_lifecycle_metrics.json` under `reports` (inference-perf may put them in a
/// folder of its own there), by stage.
pub fn stage_reports(reports: &Path) -> anyhow::Result<Vec<StageReport>> {
    let mut found = Vec::new();
    let mut folders = vec![reports.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)
            .with_context(|| format!("cannot read {}", folder.display()))?
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(stage) = name
                .strip_prefix("stage_")
                .and_then(|rest| rest.strip_suffix("_lifecycle_metrics.json"))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let report: Value = serde_json::from_slice(&std::fs::read(&path)?)
                .with_context(|| format!("{}", path.display()))?;
            found.push(stage_report(stage, &report));
        }
    }
    found.sort_by_key(|r| r.stage);
    if found.is_empty() {
        return Err(anyhow!("no stage report under {}", reports.display()));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_events_are_read_from_log_lines() {
        let line = "2026-12-06 10:00:00,123 - inference_perf.loadgen.load_generator - INFO - Stage 2 - run started";
        assert_eq!(stage_event(line), Some(StageEvent::Started(2)));
        assert_eq!(
            stage_event("... INFO - Stage 0 - run completed"),
            Some(StageEvent::Ended(0))
        );
        assert_eq!(
            stage_event("Stage 1 - run failed"),
            Some(StageEvent::Ended(1))
        );
        assert_eq!(stage_event("Stage 0 Requests 40%"), None);
        assert_eq!(stage_event("Stage 3 - session-based run started"), None);
    }

    #[test]
    fn the_sweep_config_has_a_stage_per_rate() {
        let load = Load::SharedPrefix(SharedPrefixSweep {
            groups: 4,
            prompts_per_group: 8,
            system_prompt_tokens: 1000,
            question_tokens: 100,
            output_tokens: 50,
            rates: vec![5.0, 10.0],
            stage_seconds: 10,
        });
        let yaml = load.config(
            "http://127.0.0.1:9",
            Path::new("/tok"),
            Path::new("/out"),
            3,
        );
        let config: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(config["load"]["type"], "poisson");
        assert_eq!(config["load"]["stages"][1]["rate"], 10.0);
        assert_eq!(config["data"]["shared_prefix"]["system_prompt_len"], 1000);
        assert_eq!(config["server"]["base_url"], "http://127.0.0.1:9");
        assert_eq!(config["tokenizer"]["pretrained_model_name_or_path"], "/tok");
        assert_eq!(load.rates().len(), 2);
    }

    #[test]
    fn a_stage_report_is_read_in_milliseconds() {
        let report = json!({
            "load_summary": {"requested_rate": 5.0, "achieved_rate": 4.9},
            "successes": {
                "count": 50,
                "latency": {
                    "time_to_first_token": {"mean": 0.02, "median": 0.015, "p99": 0.1},
                    "request_latency": {"mean": 0.5, "median": 0.4, "p99": 1.0},
                },
                "throughput": {"output_tokens_per_sec": 250.0, "requests_per_sec": 5.0},
            },
            "failures": {"count": 0},
        });
        let stage = stage_report(1, &report);
        assert_eq!(stage.ttft_p50_ms, 15.0);
        assert_eq!(stage.latency_p99_ms, 1000.0);
        assert_eq!(stage.successes, 50);
        assert_eq!(stage.output_tokens_per_s, 250.0);
    }
}
