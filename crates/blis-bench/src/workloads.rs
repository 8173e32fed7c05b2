//! The traces the bench runs (docs/load-benches.md, "BLIS"), as BLIS's TraceV2: a header YAML and
//! a CSV with one row per request (`sim/workload/tracev2.go`). A row's prompt is `prefix_length`
//! tokens of its `prefix_group` (the same tokens for every row of the group), then
//! `input_tokens` of its own; `output_tokens` is what BLIS generates, which no route is told.
//!
//! Every workload scales with the instances: the same work per instance at 16, 64 or 256.
//! Prompts and answers are drawn from a seeded generator, so a seed gives the same trace on every
//! machine.

use std::collections::HashMap;
use std::fmt::Write as _;

use burst_prefix_simulator::rng::SplitMix64;
use serde::{Deserialize, Serialize};

/// What a workload's routes are judged by (bench/blis/README.md): synchronous RL steps by their
/// makespans (each from its arrival to its last answer, summed), overlapping ones by the whole
/// run's, a stream by its time to first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Objective {
    Steps,
    Makespan,
    Ttft,
}

/// The workloads, in the order the bench runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// One GRPO step, all at once: 4 prompts per instance x 8 samples, 3,000-5,000-token
    /// prompts, long-tailed answers (log-normal, median 245 tokens, capped at 4,096).
    Grpo,
    /// The same step four times as large (16 prompts per instance): KV caches fill and preempt.
    GrpoSaturated,
    /// Three epochs of the same 12 prompts per instance x 8 samples, each prompt with a
    /// difficulty its answers share (hard prompts answer long every time), 300 s apart.
    Epochs,
    /// Asynchronous RL: six steps of 4 prompts per instance x 8, one every 10 s, so that each
    /// arrives while the last still decodes.
    AsyncRl,
    /// Agent sessions: 16 per instance, starting within 2 s, on one 4,000-token system prompt,
    /// 10 rounds each with their context accumulating (each round adds its answer and 1,000
    /// tokens of tool output), the next round 500 ms after an answer ends.
    Agents,
    /// A chat stream (Poisson, 2 requests per second per instance for 60 s, on 8 system
    /// prompts) with a GRPO step of 4 prompts per instance x 8 arriving at 20 s.
    ChatAndRl,
}

impl Workload {
    pub const ALL: [Workload; 6] = [
        Workload::Grpo,
        Workload::GrpoSaturated,
        Workload::Epochs,
        Workload::AsyncRl,
        Workload::Agents,
        Workload::ChatAndRl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Grpo => "grpo",
            Workload::GrpoSaturated => "grpo-saturated",
            Workload::Epochs => "epochs",
            Workload::AsyncRl => "async-rl",
            Workload::Agents => "agents",
            Workload::ChatAndRl => "chat-and-rl",
        }
    }

    pub fn objective(self) -> Objective {
        match self {
            Workload::Agents => Objective::Ttft,
            Workload::AsyncRl => Objective::Makespan,
            Workload::Grpo | Workload::GrpoSaturated | Workload::Epochs | Workload::ChatAndRl => {
                Objective::Steps
            }
        }
    }

    /// Its prompts come back (an epoch repeated) or it is a stream (agents, chat).
    pub fn repeats_or_streams(self) -> bool {
        matches!(
            self,
            Workload::Epochs | Workload::Agents | Workload::ChatAndRl
        )
    }

    /// The trace at `instances` instances from `seed`.
    pub fn trace(self, instances: usize, seed: u64) -> Trace {
        let mut build = Builder::new(seed ^ self as u64);
        match self {
            Workload::Grpo => build.rl_step(0, 0, 4 * instances, &Answers::Independent),
            Workload::GrpoSaturated => build.rl_step(0, 0, 16 * instances, &Answers::Independent),
            Workload::Epochs => {
                let prompts = 12 * instances;
                let difficulty: Vec<f64> = (0..prompts)
                    .map(|_| build.rng.lognormal(5.3, 0.9))
                    .collect();
                let lengths: Vec<u32> = (0..prompts)
                    .map(|_| build.rng.between(3_000, 5_000) as u32)
                    .collect();
                for epoch in 0..3 {
                    build.step_with(
                        epoch,
                        epoch as u64 * EPOCH_GAP_US,
                        &lengths,
                        &Answers::ByDifficulty(&difficulty),
                    );
                }
            }
            Workload::AsyncRl => {
                for step in 0..6 {
                    build.rl_step(
                        step,
                        step as u64 * 10_000_000,
                        4 * instances,
                        &Answers::Independent,
                    );
                }
            }
            Workload::Agents => build.agents(16 * instances),
            Workload::ChatAndRl => {
                build.chat(2.0 * instances as f64, 60_000_000);
                build.rl_step(0, 20_000_000, 4 * instances, &Answers::Independent);
            }
        }
        Trace {
            workload: self,
            sessions: self == Workload::Agents,
            max_tokens: MAX_TOKENS,
            rows: build.rows,
        }
    }
}

/// The cap every request asks for (`max_tokens`): one for all, as a rollout driver sends
/// (verl's `response_length`); the answers' real lengths are BLIS's to know.
pub const MAX_TOKENS: u32 = 4_096;

/// Epochs start this far apart: longer than any route's step, so that each step is timed alone.
pub const EPOCH_GAP_US: u64 = 300_000_000;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub id: u64,
    pub class: Class,
    /// The RL step it belongs to, if any.
    pub step: Option<u32>,
    pub session: Option<u32>,
    pub round: u32,
    /// Its shared prefix: a group name and its length in tokens.
    pub group: Option<(String, u32)>,
    /// Its own tokens after the prefix.
    pub input: u32,
    /// The answer BLIS generates.
    pub output: u32,
    pub arrival_us: u64,
}

/// Who sends a request (the trace's `client_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Class {
    Rl,
    Agent,
    Chat,
}

impl Class {
    fn label(self) -> &'static str {
        match self {
            Class::Rl => "rl",
            Class::Agent => "agent",
            Class::Chat => "chat",
        }
    }
}

/// A workload's trace.
#[derive(Clone, Debug)]
pub struct Trace {
    pub workload: Workload,
    /// Closed-loop sessions: BLIS sends a session's next round when its last ends
    /// (`--session-mode closed-loop`), the context accumulating.
    pub sessions: bool,
    pub max_tokens: u32,
    pub rows: Vec<Row>,
}

impl Trace {
    /// The header YAML.
    pub fn header(&self) -> String {
        let mut header =
            "trace_version: 2\ntime_unit: us\nmode: generated\nwarm_up_requests: 0\n".to_string();
        if self.sessions {
            header.push_str("session_context_growth: accumulate\n");
        }
        header
    }

    /// The data CSV, rows in arrival order.
    pub fn csv(&self) -> String {
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        rows.sort_by_key(|row| (row.arrival_us, row.id));
        let mut csv = String::from(COLUMNS);
        csv.push('\n');
        for row in rows {
            let (group, prefix) = row
                .group
                .as_ref()
                .map_or(("", 0), |(name, length)| (name.as_str(), *length));
            let session = row.session.map(|s| format!("s{s}")).unwrap_or_default();
            // request_id, client_id, tenant_id, slo_class, session_id, round_index, prefix_group,
            // prefix_length, streaming, input_tokens, output_tokens, text_tokens, image_tokens,
            // audio_tokens, video_tokens, reason_ratio, model, deadline_us, server_input_tokens,
            // arrival_time_us, send_time_us, first_chunk_time_us, last_chunk_time_us,
            // num_chunks, status, error_message, finish_reason
            let _ = writeln!(
                csv,
                "{},{},,,{},{},{},{},true,{},{},{},0,0,0,0,,0,0,{},{},0,0,0,ok,,",
                row.id,
                row.class.label(),
                session,
                row.round,
                group,
                prefix,
                row.input,
                row.output,
                row.input,
                row.arrival_us,
                row.arrival_us,
            );
        }
        csv
    }

    /// Each row by its `request_id` in BLIS's per-request results (a session's later rounds get
    /// ids of BLIS's own, and are not here).
    pub fn by_request_id(&self) -> HashMap<String, &Row> {
        self.rows
            .iter()
            .map(|row| (row.id.to_string(), row))
            .collect()
    }
}

const COLUMNS: &str = "request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,status,error_message,finish_reason";

/// How a step's answers are drawn.
enum Answers<'a> {
    /// Each sample alone: log-normal, median 245 tokens.
    Independent,
    /// Each prompt's samples around its difficulty (the median of its answers).
    ByDifficulty(&'a [f64]),
}

struct Builder {
    rng: SplitMix64,
    rows: Vec<Row>,
    next_group: u32,
}

impl Builder {
    fn new(seed: u64) -> Self {
        Builder {
            rng: SplitMix64::new(seed),
            rows: Vec::new(),
            next_group: 0,
        }
    }

    fn push(&mut self, mut row: Row) {
        row.id = self.rows.len() as u64;
        self.rows.push(row);
    }

    fn answer(&mut self, median: f64, sigma: f64, cap: u32) -> u32 {
        (self.rng.lognormal(median.ln(), sigma).round() as u32).clamp(1, cap)
    }

    /// A step of `prompts` new prompts x 8 samples arriving at `at_us`.
    fn rl_step(&mut self, step: u32, at_us: u64, prompts: usize, answers: &Answers<'_>) {
        let lengths: Vec<u32> = (0..prompts)
            .map(|_| self.rng.between(3_000, 5_000) as u32)
            .collect();
        self.step_with(step, at_us, &lengths, answers);
    }

    /// A step of the prompts whose lengths are `lengths` (prompt `i` is the same prompt in every
    /// step that uses this builder's `i`-th group of a step), 8 samples each.
    fn step_with(&mut self, step: u32, at_us: u64, lengths: &[u32], answers: &Answers<'_>) {
        // Epochs reuse their prompts: the same group names every step.
        let first_group = match answers {
            Answers::ByDifficulty(_) => 0,
            Answers::Independent => {
                let first = self.next_group;
                self.next_group += lengths.len() as u32;
                first
            }
        };
        for (prompt, &length) in lengths.iter().enumerate() {
            for _sample in 0..SAMPLES {
                let output = match answers {
                    Answers::Independent => self.answer(245.0, 0.8, MAX_TOKENS),
                    Answers::ByDifficulty(difficulty) => {
                        self.answer(difficulty[prompt], 0.35, MAX_TOKENS)
                    }
                };
                self.push(Row {
                    id: 0,
                    class: Class::Rl,
                    step: Some(step),
                    session: None,
                    round: 0,
                    // The n samples of one prompt are the same prompt: all of it is the group's.
                    group: Some((format!("p{}", first_group + prompt as u32), length)),
                    input: 0,
                    output,
                    arrival_us: at_us,
                });
            }
        }
    }

    /// `sessions` agents on one system prompt.
    fn agents(&mut self, sessions: usize) {
        for session in 0..sessions {
            let start = self.rng.below(2_000_000);
            for round in 0..ROUNDS {
                let output = self.answer(150.0, 0.6, 1_024);
                self.push(Row {
                    id: 0,
                    class: Class::Agent,
                    step: None,
                    session: Some(session as u32),
                    round,
                    group: Some(("system".into(), 4_000)),
                    input: 1_000,
                    output,
                    // The gap to the last round is the think time BLIS waits after its answer.
                    arrival_us: start + u64::from(round) * 500_000,
                });
            }
        }
    }

    /// A Poisson stream of chat requests at `rate` per second for `for_us`.
    fn chat(&mut self, rate: f64, for_us: u64) {
        let mut at = 0.0;
        loop {
            at += self.rng.exponential(1e6 / rate);
            if at >= for_us as f64 {
                return;
            }
            let system = self.rng.below(8);
            let input = self.rng.between(100, 400) as u32;
            let output = self.answer(200.0, 0.7, 2_048);
            self.push(Row {
                id: 0,
                class: Class::Chat,
                step: None,
                session: None,
                round: 0,
                group: Some((format!("system{system}"), 1_500)),
                input,
                output,
                arrival_us: at as u64,
            });
        }
    }
}

/// Samples per RL prompt (GRPO's n).
pub const SAMPLES: usize = 8;

/// Rounds per agent session.
const ROUNDS: u32 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_trace_and_another_seed_another() {
        let a = Workload::Grpo.trace(16, 1);
        assert_eq!(a.csv(), Workload::Grpo.trace(16, 1).csv());
        assert_ne!(a.csv(), Workload::Grpo.trace(16, 2).csv());
    }

    #[test]
    fn a_grpo_step_is_four_prompts_per_instance_of_eight_identical_samples_at_once() {
        let trace = Workload::Grpo.trace(16, 1);
        assert_eq!(trace.rows.len(), 16 * 4 * SAMPLES);
        assert!(trace.rows.iter().all(|r| r.arrival_us == 0 && r.input == 0));
        let groups: std::collections::HashSet<_> =
            trace.rows.iter().map(|r| r.group.clone()).collect();
        assert_eq!(groups.len(), 16 * 4);
        assert!(trace
            .rows
            .iter()
            .all(|r| (1..=MAX_TOKENS).contains(&r.output)));
    }

    #[test]
    fn epochs_repeat_their_prompts_and_each_prompts_answers_share_its_difficulty() {
        let trace = Workload::Epochs.trace(16, 1);
        let prompts = 16 * 12;
        assert_eq!(trace.rows.len(), 3 * prompts * SAMPLES);
        let first: Vec<_> = trace.rows[..prompts * SAMPLES]
            .iter()
            .map(|r| r.group.clone())
            .collect();
        let third: Vec<_> = trace.rows[2 * prompts * SAMPLES..]
            .iter()
            .map(|r| r.group.clone())
            .collect();
        assert_eq!(first, third, "the same prompts every epoch");
        // A prompt's answers agree more with one another than with other prompts'.
        let mean_of = |rows: &[Row]| rows.iter().map(|r| r.output as f64).sum::<f64>() / 8.0;
        let means: Vec<f64> = trace.rows[..prompts * SAMPLES]
            .chunks(SAMPLES)
            .map(mean_of)
            .collect();
        let spread = means.iter().cloned().fold(f64::MIN, f64::max)
            / means.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread > 10.0, "prompts differ in difficulty: {spread}");
        assert_eq!(
            trace.rows[2 * prompts * SAMPLES].arrival_us,
            2 * EPOCH_GAP_US
        );
    }

    #[test]
    fn the_csv_has_every_column_on_every_row() {
        for workload in Workload::ALL {
            let trace = workload.trace(16, 3);
            let csv = trace.csv();
            let columns = COLUMNS.split(',').count();
            for line in csv.lines() {
                assert_eq!(line.split(',').count(), columns, "{workload:?}: {line}");
            }
            assert_eq!(csv.lines().count(), trace.rows.len() + 1);
        }
    }

    #[test]
    fn agents_are_sessions_of_consecutive_rounds_on_one_system_prompt() {
        let trace = Workload::Agents.trace(16, 1);
        assert!(trace.sessions && trace.header().contains("accumulate"));
        let session_zero: Vec<u32> = trace
            .rows
            .iter()
            .filter(|r| r.session == Some(0))
            .map(|r| r.round)
            .collect();
        assert_eq!(session_zero, (0..ROUNDS).collect::<Vec<_>>());
        assert!(trace
            .rows
            .iter()
            .all(|r| r.group == Some(("system".into(), 4_000))));
    }
}
