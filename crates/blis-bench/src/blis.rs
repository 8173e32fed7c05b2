//! BLIS itself: built once per pinned commit (and version of our policy) from the checkout the
//! user names, with bench/blis/'s routing policy added, and run once per route and trace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::Child;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::placer::PlacerStats;

/// The BLIS commit the bench runs (2026-12-07's `main` of inference-sim/inference-sim): its step
/// model, scorers and flags are what the results describe, so another commit is refused.
pub const PINNED: &str = "f90a1e3a";

/// Simulated time every replay may run: ten hours, far past any trace's last answer.
const HORIZON_US: u64 = 36_000_000_000;

/// Our routing policy and its registration, kept in this repository (bench/blis/).
const POLICY: &str = include_str!("../../../bench/blis/routing_burst_prefix.go");
const REGISTER: &str = include_str!("../../../bench/blis/register.patch");

/// A built BLIS, run from its own tree (it reads `defaults.yaml` and `model_configs/` there).
#[derive(Clone, Debug)]
pub struct Blis {
    pub dir: PathBuf,
    /// The full commit it was built from.
    pub commit: String,
}

/// The model and hardware every run simulates, and BLIS's flags for them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Setting {
    pub model: String,
    pub hardware: String,
    pub tp: u32,
}

impl Default for Setting {
    fn default() -> Self {
        Setting {
            model: "meta-llama/llama-3.1-8b-instruct".into(),
            hardware: "H100".into(),
            tp: 1,
        }
    }
}

impl Blis {
    /// BLIS at [`PINNED`] from the git checkout `source`, with our policy, built under `cache`
    /// (once: a build whose sources are unchanged is reused).
    pub fn build(source: &Path, cache: &Path) -> anyhow::Result<Blis> {
        Blis::build_from(source, cache, true)
    }

    /// The same commit as it is, without our policy: what the bench's round-robin is checked
    /// against.
    pub fn build_plain(source: &Path, cache: &Path) -> anyhow::Result<Blis> {
        Blis::build_from(source, cache, false)
    }

    fn build_from(source: &Path, cache: &Path, ours: bool) -> anyhow::Result<Blis> {
        let commit = git(source, &["rev-parse", "HEAD"]).with_context(|| {
            format!(
                "BLIS_SRC={} is not a git checkout of BLIS (github.com/inference-sim/inference-sim)",
                source.display()
            )
        })?;
        if !commit.starts_with(PINNED) {
            bail!(
                "BLIS_SRC={} is at {commit}; the bench is pinned to {PINNED} (its results describe \
                 that commit's step model and routers): `git -C {} checkout {PINNED}`",
                source.display(),
                source.display()
            );
        }
        let key = match ours {
            true => format!(
                "{:016x}",
                xxhash_rust::xxh64::xxh64(format!("{commit}{POLICY}{REGISTER}").as_bytes(), 0)
            ),
            false => "plain".to_string(),
        };
        let dir = cache.join(format!("blis-{PINNED}-{key}"));
        let binary = dir.join("blis");
        if binary.exists() {
            return Ok(Blis { dir, commit });
        }
        let building = cache.join(format!("blis-{PINNED}-{key}.building"));
        let _ = std::fs::remove_dir_all(&building);
        std::fs::create_dir_all(&building)?;
        // The commit's tree, without whatever else the checkout holds.
        let archive = Command::new("git")
            .arg("-C")
            .arg(source)
            .args(["archive", "--format=tar", &commit])
            .stdout(Stdio::piped())
            .spawn()
            .context("running git archive")?;
        let status = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&building)
            .stdin(archive.stdout.context("git archive's output")?)
            .status()
            .context("running tar")?;
        if !status.success() {
            bail!("unpacking BLIS {commit} failed: tar {status}");
        }
        if ours {
            std::fs::write(building.join("sim/routing_burst_prefix.go"), POLICY)?;
            std::fs::write(building.join("register.patch"), REGISTER)?;
            run(Command::new("git")
                .current_dir(&building)
                .args(["apply", "register.patch"]))
            .context("registering the burst-prefix policy in BLIS")?;
        }
        run(Command::new("go")
            .current_dir(&building)
            .args(["build", "-o", "blis", "."]))
        .context("building BLIS (go build; its modules come from the Go module proxy)")?;
        std::fs::rename(&building, &dir)?;
        Ok(Blis { dir, commit })
    }

    /// Runs `route` on the trace at `trace_dir` (`header.yaml`, `data.csv`) on `instances`
    /// instances, writing what it needs under `out`. Bounded by `limit`.
    pub fn replay(
        &self,
        run: &Replay<'_>,
        placer: Option<&PlacerCommand>,
        out: &Path,
    ) -> anyhow::Result<Outcome> {
        std::fs::create_dir_all(out)?;
        let results = out.join("requests.json");
        let mut command = Command::new(self.dir.join("blis"));
        command
            .current_dir(&self.dir)
            .arg("replay")
            .arg("--trace-header")
            .arg(run.trace_dir.join("header.yaml"))
            .arg("--trace-data")
            .arg(run.trace_dir.join("data.csv"))
            .args(["--model", &run.setting.model])
            .args(["--hardware", &run.setting.hardware])
            .args(["--tp", &run.setting.tp.to_string()])
            .args(["--num-instances", &run.instances.to_string()])
            .args(["--seed", &run.seed.to_string()])
            .arg("--results-path")
            .arg(&results)
            // Long enough for every request of every route to finish (BLIS's default, twice
            // the last arrival, cuts closed-loop sessions short).
            .args(["--horizon", &HORIZON_US.to_string()])
            .args(run.args);
        if run.sessions {
            command.args(["--session-mode", "closed-loop"]);
        }
        let stdout = out.join("stdout.txt");
        let stderr = out.join("stderr.txt");
        command
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?);
        let started = Instant::now();
        let mut placer_child = None;
        let stats_path = out.join("placer.json");
        if let Some(placer) = placer {
            let asks = out.join("asks.pipe");
            let answers = out.join("answers.pipe");
            for pipe in [&asks, &answers] {
                let _ = std::fs::remove_file(pipe);
                run_quiet(Command::new("mkfifo").arg(pipe)).context("making the placer's pipes")?;
            }
            let planner = out.join("planner.yaml");
            std::fs::write(&planner, &placer.planner)?;
            let mut cmd = Command::new(&placer.binary);
            cmd.arg("place")
                .arg("--asks")
                .arg(&asks)
                .arg("--answers")
                .arg(&answers)
                .arg("--planner")
                .arg(&planner)
                .args(["--max-tokens", &run.max_tokens.to_string()])
                .arg("--stats")
                .arg(&stats_path)
                .arg("--decisions")
                .arg(out.join("decisions.txt"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(out.join("placer-stderr.txt"))?);
            placer_child = Some(Child::spawn(cmd, "the burst-prefix placer")?);
            command
                .env("BURST_PREFIX_TO_PLACER", &asks)
                .env("BURST_PREFIX_FROM_PLACER", &answers);
        }
        let mut blis = Child::spawn(command, "blis replay")?;
        let status = blis.wait_for(run.limit)?;
        let seconds = started.elapsed().as_secs_f64();
        let placer_stats = match placer_child.take() {
            // BLIS failed: whatever the placer waits for will not come (dropped: killed).
            Some(_) if !status.success() => None,
            Some(mut child) => {
                // Done once BLIS closed its end.
                child.wait_for(Duration::from_secs(30)).ok();
                std::fs::read_to_string(&stats_path)
                    .ok()
                    .and_then(|text| serde_json::from_str::<PlacerStats>(&text).ok())
            }
            None => None,
        };
        let text = std::fs::read_to_string(&stdout)?;
        if !status.success() {
            let tail = std::fs::read_to_string(&stderr).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "blis replay {} exited {status}: {}",
                run.args.join(" "),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        let cluster = parse_cluster(&text)?;
        if cluster.still_queued + cluster.still_running > 0 {
            bail!(
                "{} request(s) were not answered within BLIS's horizon ({} queued, {} running)",
                cluster.still_queued + cluster.still_running,
                cluster.still_queued,
                cluster.still_running
            );
        }
        Ok(Outcome {
            cluster,
            requests: serde_json::from_str(
                &std::fs::read_to_string(&results)
                    .with_context(|| format!("reading {}", results.display()))?,
            )
            .with_context(|| format!("parsing {}", results.display()))?,
            seconds,
            placer: placer_stats,
        })
    }
}

/// One replay: a trace, a route's BLIS arguments, the fleet.
pub struct Replay<'a> {
    pub trace_dir: &'a Path,
    pub sessions: bool,
    pub max_tokens: u32,
    pub setting: &'a Setting,
    pub instances: usize,
    pub seed: u64,
    pub args: &'a [String],
    pub limit: Duration,
}

/// How to start our placer for a run.
pub struct PlacerCommand {
    pub binary: PathBuf,
    /// The route's planner config (YAML).
    pub planner: String,
}

/// What one replay produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub cluster: Cluster,
    pub requests: Vec<RequestResult>,
    /// Wall seconds the replay took (BLIS and, for ours, the placer beside it).
    pub seconds: f64,
    pub placer: Option<PlacerStats>,
}

/// The cluster's figures, as BLIS prints them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Cluster {
    pub completed_requests: u64,
    pub still_queued: u64,
    pub still_running: u64,
    pub vllm_estimated_duration_s: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p99_ms: f64,
    pub e2e_mean_ms: f64,
    pub e2e_p99_ms: f64,
    pub preemption_count: u64,
    #[serde(skip)]
    pub hit_rate: f64,
    #[serde(skip)]
    pub preemption_rate: f64,
}

/// One request's result (`--results-path`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RequestResult {
    /// The trace's `request_id` (a number there), or the id BLIS gave a session's later round.
    #[serde(deserialize_with = "number_or_text")]
    pub request_id: String,
    pub ttft_us: f64,
    pub e2e_us: f64,
    #[serde(default)]
    pub output_tokens: u64,
}

/// The object whose `instance_id` is `"cluster"`, and the KV cache lines after it.
pub fn parse_cluster(stdout: &str) -> anyhow::Result<Cluster> {
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .rposition(|line| line.trim() == "\"instance_id\": \"cluster\",")
        .context("BLIS printed no cluster figures")?;
    let start = lines[..at]
        .iter()
        .rposition(|line| line.trim() == "{")
        .context("BLIS's cluster figures have no opening brace")?;
    let end = at
        + lines[at..]
            .iter()
            .position(|line| line.trim() == "}")
            .context("BLIS's cluster figures have no closing brace")?;
    let mut cluster: Cluster =
        serde_json::from_str(&lines[start..=end].join("\n")).context("BLIS's cluster figures")?;
    // BLIS prints the KV section only when one of its figures is not 0.
    let kv = lines[end..]
        .iter()
        .any(|line| line.trim() == "=== KV Cache Metrics ===");
    let figure = |name: &str| -> anyhow::Result<f64> {
        if !kv {
            return Ok(0.0);
        }
        lines[end..]
            .iter()
            .find_map(|line| line.trim().strip_prefix(name))
            .with_context(|| format!("BLIS printed no `{name}` line"))?
            .trim()
            .parse()
            .with_context(|| format!("BLIS's `{name}`"))
    };
    cluster.hit_rate = figure("Cache Hit Rate:")?;
    cluster.preemption_rate = figure("Preemption Rate:")?;
    Ok(cluster)
}

fn number_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    })
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("git").arg("-C").arg(dir).args(args).output()?;
    if !output.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command.output()?;
    if !output.status.success() {
        bail!(
            "{:?} exited {}: {}",
            command,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

fn run_quiet(command: &mut Command) -> anyhow::Result<()> {
    run(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_figures_and_the_kv_lines_are_read_from_blis_output() {
        let stdout = r#"=== Simulation Metrics ===
{
  "instance_id": "instance_0",
  "completed_requests": 3,
  "vllm_estimated_duration_s": 1.0
}
=== Simulation Metrics ===
{
  "instance_id": "cluster",
  "completed_requests": 2048,
  "still_queued": 0,
  "still_running": 0,
  "injected_requests": 2048,
  "vllm_estimated_duration_s": 46.18824,
  "e2e_mean_ms": 11873.4,
  "e2e_p99_ms": 25704.9,
  "ttft_mean_ms": 3150.3,
  "ttft_p99_ms": 7655.6,
  "preemption_count": 16
}
=== KV Cache Metrics ===
Preemption Rate: 0.0078
Cache Hit Rate: 0.0026
"#;
        let cluster = parse_cluster(stdout).unwrap();
        assert_eq!(cluster.completed_requests, 2048);
        assert_eq!(cluster.vllm_estimated_duration_s, 46.18824);
        assert_eq!(cluster.preemption_count, 16);
        assert_eq!(
            (cluster.hit_rate, cluster.preemption_rate),
            (0.0026, 0.0078)
        );
        assert!(parse_cluster("no figures").is_err());
        // Without a KV section every figure of it is 0.
        let quiet = stdout.split("=== KV").next().unwrap();
        assert_eq!(parse_cluster(quiet).unwrap().hit_rate, 0.0);
    }
}
