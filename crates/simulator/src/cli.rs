//! `burst-prefix-tools simulate`: its arguments, and the run that turns them into output.

use std::path::PathBuf;

use burst_prefix_api::{BalanceBy, MemoryConfig, PlannerConfig};
use clap::{Args, ValueEnum};

use crate::arrivals::{simulate_arrivals, Timing};
use crate::chart;
use crate::policy::{
    ApproxPrefix, Burst, CacheAware, CacheAwareParams, LeastLoaded, OnlinePolicy, Policy,
    RoundRobin, ZeroWait,
};
use crate::report::{PolicyReport, Report};
use crate::simulate::{lower_bound, simulate, Cluster};
use crate::workload::{hash_steps, Agentic, Grpo, Mixed, Multiturn, Workload};

/// The workload to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// GRPO rollouts: each step, --prompts new prompts, each sent --samples times at once.
    Grpo,
    /// Agent fan-out: each step, --fanout requests sharing one system prompt, each with its
    /// own suffix.
    Agentic,
    /// Chat sessions: each step, one more turn of each of --sessions sessions, whose prompts
    /// grow turn by turn.
    Multiturn,
    /// All three on one cluster, --steps rounds of three windows: every window about half of
    /// --sessions sessions take a turn (trickling in), the first of a round adds a GRPO burst
    /// (--prompts / 4 prompts x --samples, on a 256-token template), the second an agent
    /// fan-out (--fanout / 4 on a 4096-token system prompt). Per-part lengths are each
    /// workload's defaults.
    Mixed,
}

/// `balanceBy` of the burst policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BalanceByArg {
    Requests,
    Tokens,
}

/// Compare routing policies on a simulated cluster: prefill tokens, balance and co-location.
///
/// Every policy routes the same seeded requests on its own copy of the cluster: R replicas,
/// each with a block-level LRU prefix cache. Prints a table (or --json), and optionally writes
/// an SVG chart.
#[derive(Clone, Debug, Args)]
pub struct SimulateArgs {
    /// The workload to generate.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Grpo)]
    pub workload: WorkloadKind,
    /// Seed of the workload generator; the same seed gives the same requests.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replicas in the cluster.
    #[arg(long, default_value_t = 8)]
    pub replicas: usize,
    /// Prefix-cache capacity of each replica, in blocks (the routers' indexes get the same).
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Tokens per prefix block.
    #[arg(long, default_value_t = 64)]
    pub block_size_tokens: i64,
    /// Steps (bursts of requests that arrive together); for multiturn, turns per session; for
    /// mixed, rounds of three windows.
    #[arg(long, default_value_t = 4)]
    pub steps: usize,

    /// Distinct prompts per GRPO step (m).
    #[arg(long, default_value_t = 64, help_heading = "Workload sizes")]
    pub prompts: usize,
    /// Samples per GRPO prompt (n).
    #[arg(long, default_value_t = 8, help_heading = "Workload sizes")]
    pub samples: usize,
    /// Agentic requests per step.
    #[arg(long, default_value_t = 256, help_heading = "Workload sizes")]
    pub fanout: usize,
    /// Multi-turn sessions.
    #[arg(long, default_value_t = 64, help_heading = "Workload sizes")]
    pub sessions: usize,
    /// Tokens every prompt starts with: GRPO's chat template, the agentic or multi-turn system
    /// prompt [default: grpo 0, agentic 4096, multiturn 512].
    #[arg(long, help_heading = "Workload sizes")]
    pub shared_prefix_tokens: Option<usize>,
    /// Fewest tokens of a request's own part (uniform up to --max-tokens): a GRPO prompt, an
    /// agentic suffix, what a multi-turn turn adds [default: grpo 256, agentic 64, multiturn 128].
    #[arg(long, help_heading = "Workload sizes")]
    pub min_tokens: Option<usize>,
    /// Most tokens of a request's own part [default: grpo 2048, agentic 512, multiturn 512].
    #[arg(long, help_heading = "Workload sizes")]
    pub max_tokens: Option<usize>,

    /// k of the burst policy: at most this many members of one group per replica; -1 unlimited.
    /// (The simulation counts prefill only, not decode batch width, so k > 1 only adds prefill.)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, help_heading = "Burst policy")]
    pub max_per_replica: i64,
    /// N of the burst policy: singles sharing their first N blocks are co-located; 0 groups
    /// identical prompts only.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        help_heading = "Burst policy"
    )]
    pub min_colocate_blocks: i64,
    /// balanceBy of the burst policy. The default here is `tokens` (the service's is `requests`):
    /// a replica's work in this simulation is the tokens it prefills, and rollout prompts vary
    /// in length, as in examples/rl-rollout-policy.yaml.
    #[arg(long, value_enum, default_value_t = BalanceByArg::Tokens, help_heading = "Burst policy")]
    pub balance_by: BalanceByArg,
    /// memory.loadHalfLifeMs of the burst policy: load carried over from earlier windows halves
    /// every this many ms (steps are --step-ms apart). Its cache model holds --cache-blocks
    /// blocks per replica (memory.cacheTokensPerReplica = cache blocks x block size).
    #[arg(long, default_value_t = 0, help_heading = "Burst policy")]
    pub load_half_life_ms: i64,
    /// Simulated time between two steps, for the memory's clock.
    #[arg(long, default_value_t = 1_000, help_heading = "Burst policy")]
    pub step_ms: u64,

    /// zero-wait: a step's requests arrive within this long of its start (the window policies
    /// see them all, as a window at least this long collects them).
    #[arg(long, default_value_t = 100, help_heading = "Zero-wait policies")]
    pub arrival_spread_ms: u64,
    /// zero-wait: prefill speed of a replica, in tokens per ms.
    #[arg(long, default_value_t = 10.0, help_heading = "Zero-wait policies")]
    pub prefill_tokens_per_ms: f64,
    /// zero-wait: a request completes this long after its prefill.
    #[arg(long, default_value_t = 200, help_heading = "Zero-wait policies")]
    pub decode_ms: u64,
    /// zero-wait-decay: the in-flight estimate's half-life, without completions.
    #[arg(long, default_value_t = 1_000, help_heading = "Zero-wait policies")]
    pub in_flight_half_life_ms: u64,

    /// cache-aware: follow the best prefix match when it covers more than this share of a prompt.
    #[arg(
        long,
        default_value_t = 0.3,
        help_heading = "Cache-aware policy (SGLang's defaults)"
    )]
    pub cache_threshold: f64,
    /// cache-aware: loads are imbalanced when max - min exceeds this ...
    #[arg(
        long,
        default_value_t = 64,
        help_heading = "Cache-aware policy (SGLang's defaults)"
    )]
    pub balance_abs_threshold: u64,
    /// ... and max exceeds this times min.
    #[arg(
        long,
        default_value_t = 1.5,
        help_heading = "Cache-aware policy (SGLang's defaults)"
    )]
    pub balance_rel_threshold: f64,

    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write a chart of prefill ratio and imbalance per policy to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// Runs the simulation: the text for stdout, or a one-line error naming the bad flag.
pub fn run(args: &SimulateArgs) -> Result<String, String> {
    let config = planner_config(args)?;
    let workload = workload(args)?;
    let spec = config.block_spec();
    if workload.max_prompt_tokens() > spec.max_blocks * spec.block_size_tokens {
        return Err(format!(
            "prompts of up to {} tokens exceed the {}-block hash cap at --block-size-tokens {}",
            workload.max_prompt_tokens(),
            spec.max_blocks,
            spec.block_size_tokens
        ));
    }
    if args.replicas == 0 {
        return Err("--replicas must be >= 1".into());
    }
    let cache_aware = CacheAwareParams {
        cache_threshold: args.cache_threshold,
        balance_abs_threshold: args.balance_abs_threshold,
        balance_rel_threshold: args.balance_rel_threshold,
    };
    if !(0.0..=1.0).contains(&cache_aware.cache_threshold) {
        return Err("--cache-threshold must be between 0 and 1".into());
    }
    if !(cache_aware.balance_rel_threshold.is_finite() && cache_aware.balance_rel_threshold >= 0.0)
    {
        return Err("--balance-rel-threshold must be >= 0".into());
    }
    if !(args.prefill_tokens_per_ms.is_finite() && args.prefill_tokens_per_ms > 0.0) {
        return Err("--prefill-tokens-per-ms must be > 0".into());
    }
    if args.in_flight_half_life_ms == 0 {
        return Err("--in-flight-half-life-ms must be >= 1".into());
    }
    let timing = Timing {
        spread_ms: args.arrival_spread_ms,
        prefill_tokens_per_ms: args.prefill_tokens_per_ms,
        decode_ms: args.decode_ms,
        seed: args.seed,
    };

    let steps = hash_steps(&workload.generate(args.seed), spec);
    let cluster = Cluster {
        replicas: args.replicas,
        cache_blocks: args.cache_blocks,
    };
    let (replicas, index_blocks) = (args.replicas, args.cache_blocks);
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(RoundRobin::new(replicas)),
        Box::new(LeastLoaded::new(replicas)),
        Box::new(ApproxPrefix::new(replicas, index_blocks)),
        Box::new(CacheAware::new(replicas, index_blocks, cache_aware)),
        Box::new(Burst::new(
            replicas,
            config.plan_params(),
            config.memory_settings(),
            args.step_ms,
        )),
        Box::new(Burst::new(
            replicas,
            config.plan_params(),
            None,
            args.step_ms,
        )),
    ];
    // Placed as each request arrives (`arrivals`), beside the step-at-once policies.
    let mut online: Vec<Box<dyn OnlinePolicy>> = vec![
        Box::new(ZeroWait::new(
            replicas,
            config.plan_params(),
            config.memory_settings(),
            None,
        )),
        Box::new(ZeroWait::new(
            replicas,
            config.plan_params(),
            config.memory_settings(),
            Some(args.in_flight_half_life_ms),
        )),
    ];
    let bound = lower_bound(&steps);
    let report = Report {
        workload: workload.name().to_string(),
        seed: args.seed,
        replicas,
        cache_blocks: args.cache_blocks,
        block_size_tokens: spec.block_size_tokens,
        steps: steps.len(),
        requests: steps.iter().map(|step| step.len() as u64).sum(),
        lower_bound_tokens: bound,
        policies: policies
            .iter_mut()
            .map(|policy| simulate(&steps, cluster, policy.as_mut()))
            .chain(
                online
                    .iter_mut()
                    .map(|policy| simulate_arrivals(&steps, cluster, timing, policy.as_mut())),
            )
            .map(|outcome| PolicyReport::new(&outcome, bound))
            .collect(),
    };
    if let Some(path) = &args.svg {
        std::fs::write(path, chart::svg(&report)?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(if args.json {
        report.to_json()
    } else {
        report.to_table()
    })
}

/// The burst policy's knobs, checked by the one validation function (docs/behaviour.md §2).
fn planner_config(args: &SimulateArgs) -> Result<PlannerConfig, String> {
    let config = PlannerConfig {
        max_per_replica: args.max_per_replica,
        block_size_tokens: args.block_size_tokens,
        min_colocate_blocks: args.min_colocate_blocks,
        balance_by: match args.balance_by {
            BalanceByArg::Requests => BalanceBy::Requests,
            BalanceByArg::Tokens => BalanceBy::Tokens,
        },
        memory: MemoryConfig {
            enabled: true,
            cache_tokens_per_replica: (args.cache_blocks as i64)
                .saturating_mul(args.block_size_tokens),
            load_half_life_ms: args.load_half_life_ms,
        },
        ..PlannerConfig::default()
    };
    config.validate().map_err(|e| {
        format!("invalid options: {e}")
            .replace("maxPerReplica", "--max-per-replica")
            .replace("blockSizeTokens", "--block-size-tokens")
            .replace("minColocateBlocks", "--min-colocate-blocks")
            .replace(
                "memory.cacheTokensPerReplica",
                "--cache-blocks x --block-size-tokens",
            )
            .replace("memory.loadHalfLifeMs", "--load-half-life-ms")
    })?;
    Ok(config)
}

fn workload(args: &SimulateArgs) -> Result<Workload, String> {
    // (shared prefix, min, max) defaults per workload.
    let (shared, min, max) = match args.workload {
        WorkloadKind::Grpo => (0, 256, 2048),
        WorkloadKind::Agentic => (4096, 64, 512),
        WorkloadKind::Multiturn | WorkloadKind::Mixed => (512, 128, 512),
    };
    let shared = args.shared_prefix_tokens.unwrap_or(shared);
    let min_tokens = args.min_tokens.unwrap_or(min);
    let max_tokens = args.max_tokens.unwrap_or(max);
    if min_tokens == 0 {
        return Err("--min-tokens must be >= 1".into());
    }
    if min_tokens > max_tokens {
        return Err(format!(
            "--min-tokens ({min_tokens}) must be <= --max-tokens ({max_tokens})"
        ));
    }
    let at_least_one = |flag: &str, value: usize| {
        if value == 0 {
            Err(format!("--{flag} must be >= 1"))
        } else {
            Ok(value)
        }
    };
    let steps = at_least_one("steps", args.steps)?;
    Ok(match args.workload {
        WorkloadKind::Grpo => Workload::Grpo(Grpo {
            steps,
            prompts: at_least_one("prompts", args.prompts)?,
            samples: at_least_one("samples", args.samples)?,
            shared_prefix_tokens: shared,
            min_tokens,
            max_tokens,
        }),
        WorkloadKind::Agentic => Workload::Agentic(Agentic {
            steps,
            fanout: at_least_one("fanout", args.fanout)?,
            system_prompt_tokens: shared,
            min_tokens,
            max_tokens,
        }),
        WorkloadKind::Multiturn => Workload::Multiturn(Multiturn {
            steps,
            sessions: at_least_one("sessions", args.sessions)?,
            system_prompt_tokens: shared,
            min_tokens,
            max_tokens,
        }),
        WorkloadKind::Mixed => Workload::Mixed(Mixed {
            rounds: steps,
            grpo: Grpo {
                steps,
                prompts: at_least_one("prompts", args.prompts)?.div_ceil(4),
                samples: at_least_one("samples", args.samples)?,
                shared_prefix_tokens: 256,
                min_tokens: 256,
                max_tokens: 2048,
            },
            agentic: Agentic {
                steps,
                fanout: at_least_one("fanout", args.fanout)?.div_ceil(4),
                system_prompt_tokens: 4096,
                min_tokens: 64,
                max_tokens: 512,
            },
            multiturn: Multiturn {
                steps,
                sessions: at_least_one("sessions", args.sessions)?,
                system_prompt_tokens: shared,
                min_tokens,
                max_tokens,
            },
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn parse(flags: &[&str]) -> SimulateArgs {
        Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    const SMALL: &[&str] = &[
        "--replicas",
        "4",
        "--prompts",
        "8",
        "--samples",
        "4",
        "--steps",
        "2",
    ];

    #[test]
    fn small_grpo_run_prints_every_policy() {
        let table = run(&parse(SMALL)).unwrap();
        for policy in [
            "round-robin",
            "least-loaded",
            "approx-prefix",
            "cache-aware",
            "burst",
            "burst-nomem",
            "zero-wait",
            "zero-wait-decay",
        ] {
            assert!(
                table.lines().any(|line| line.starts_with(policy)),
                "{policy} missing:\n{table}"
            );
        }
    }

    #[test]
    fn json_is_reproducible_and_writes_the_svg() {
        let dir = std::env::temp_dir().join(format!("burst-prefix-sim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("chart.svg");
        let mut flags = SMALL.to_vec();
        flags.extend(["--json", "--svg", svg.to_str().unwrap()]);
        let first = run(&parse(&flags)).unwrap();
        assert_eq!(first, run(&parse(&flags)).unwrap());
        let json: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(json["workload"], "grpo");
        assert_eq!(json["policies"].as_array().unwrap().len(), 8);
        assert!(std::fs::read_to_string(&svg).unwrap().contains("burst"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_grpo_meets_the_benchmark_targets() {
        let json: serde_json::Value =
            serde_json::from_str(&run(&parse(&["--json"])).unwrap()).unwrap();
        let policy = |name: &str| {
            json["policies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap()
                .clone()
        };
        let figure = |name: &str, field: &str| policy(name)[field].as_f64().unwrap();
        let ours = |field: &str| figure("burst", field);
        assert!(ours("ratioToLowerBound") <= 1.05, "{json}");
        assert!(ours("imbalance") <= 1.25, "{json}");
        assert!(figure("round-robin", "prefillTokens") >= 4.0 * ours("prefillTokens"));
        for baseline in ["approx-prefix", "cache-aware"] {
            assert!(
                figure(baseline, "prefillTokens") >= ours("prefillTokens"),
                "{json}"
            );
            assert!(figure(baseline, "imbalance") > ours("imbalance"), "{json}");
        }
    }

    #[test]
    fn every_workload_runs() {
        for workload in ["agentic", "multiturn"] {
            let mut flags = vec!["--workload", workload, "--steps", "2", "--replicas", "2"];
            flags.extend([
                "--fanout",
                "6",
                "--sessions",
                "4",
                "--shared-prefix-tokens",
                "200",
            ]);
            assert!(run(&parse(&flags)).unwrap().contains(workload));
        }
    }

    #[test]
    fn bad_flags_are_named() {
        let err = run(&parse(&["--max-per-replica", "0"])).unwrap_err();
        assert!(err.contains("--max-per-replica is 0"), "{err}");
        let err = run(&parse(&["--min-tokens", "9", "--max-tokens", "8"])).unwrap_err();
        assert!(err.contains("--min-tokens (9)"), "{err}");
        let err = run(&parse(&["--replicas", "0"])).unwrap_err();
        assert!(err.contains("--replicas"), "{err}");
        let err = run(&parse(&[
            "--block-size-tokens",
            "1",
            "--max-tokens",
            "5000",
        ]))
        .unwrap_err();
        assert!(err.contains("hash cap"), "{err}");
    }
}
