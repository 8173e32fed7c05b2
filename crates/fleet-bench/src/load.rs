//! The bench's own driver, for what no harness sends: an RL step (P prompts x n samples sent at
//! the same instant, long-tailed output lengths; its makespan is the figure) and agent fan-outs
//! (several agents each sending a fan-out on its own system prompt at once). Prompts are the
//! simulator's seeded workloads (`burst_prefix_simulator::workload`) as text, one word a token
//! (crates/engine-bench/src/prompts.rs): llm-d-inference-sim's dummy tokenizer counts one token
//! a word, and the peer routers build their trees from text.

use std::time::{Duration, Instant};

use anyhow::Context;
use burst_prefix_engine_bench::prompts::text;
use burst_prefix_engine_bench::usage;
use burst_prefix_simulator::rng::SplitMix64;
use burst_prefix_simulator::workload::{Agentic, Grpo, Workload};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::sim::MODEL;

/// Output lengths: log-normal, as RL rollouts' and chats' answer lengths are long-tailed,
/// clamped to `1..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputLengths {
    pub median: f64,
    /// The standard deviation of the length's logarithm.
    pub sigma: f64,
    pub max: u32,
}

impl OutputLengths {
    /// One length (Box-Muller from two uniform draws).
    pub fn draw(&self, rng: &mut SplitMix64) -> u32 {
        let uniform = |rng: &mut SplitMix64| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let u1 = uniform(rng).max(f64::MIN_POSITIVE);
        let u2 = uniform(rng);
        let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let length = self.median * (self.sigma * normal).exp();
        (length.round() as u32).clamp(1, self.max)
    }
}

/// One request of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: String,
    /// Prompt tokens to the simulator (one a word).
    pub prompt_tokens: usize,
    pub max_tokens: u32,
}

/// An RL step shape: `prompts` x `samples` at once.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RlShape {
    pub prompts: usize,
    pub samples: usize,
}

/// The RL workload: each step's prompts share a system prompt, their own part makes them 1-4k
/// tokens long in all.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RlWorkload {
    pub shape: RlShape,
    pub steps: usize,
    pub system_prompt_tokens: usize,
    pub min_prompt_tokens: usize,
    pub max_prompt_tokens: usize,
    pub output: OutputLengths,
}

/// Agent fan-outs: `agents` agents, each with a system prompt of its own, each sending
/// `fanout` requests at once in every round; all agents at the same instant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentWorkload {
    pub agents: usize,
    pub fanout: usize,
    pub rounds: usize,
    pub system_prompt_tokens: usize,
    pub min_suffix_tokens: usize,
    pub max_suffix_tokens: usize,
    pub output: OutputLengths,
}

fn requests_of(
    prompts: Vec<Vec<u32>>,
    output: &OutputLengths,
    rng: &mut SplitMix64,
) -> Vec<Request> {
    prompts
        .into_iter()
        .map(|tokens| Request {
            prompt: text(&tokens),
            prompt_tokens: tokens.len(),
            max_tokens: output.draw(rng),
        })
        .collect()
}

impl RlWorkload {
    /// Its steps (arrival order shuffled within a step, as the simulator's workloads are).
    pub fn steps(&self, seed: u64) -> Vec<Vec<Request>> {
        let grpo = Workload::Grpo(Grpo {
            steps: self.steps,
            prompts: self.shape.prompts,
            samples: self.shape.samples,
            shared_prefix_tokens: self.system_prompt_tokens,
            min_tokens: self.min_prompt_tokens - self.system_prompt_tokens,
            max_tokens: self.max_prompt_tokens - self.system_prompt_tokens,
        });
        let mut lengths = SplitMix64::new(seed ^ 0x6f75_7470_7574);
        grpo.generate(seed)
            .into_iter()
            .map(|step| requests_of(step, &self.output, &mut lengths))
            .collect()
    }
}

impl AgentWorkload {
    /// Its rounds: every agent's fan-out of the round, agent after agent (agent `a`'s requests
    /// are `a * fanout .. (a + 1) * fanout`).
    pub fn rounds(&self, seed: u64) -> Vec<Vec<Request>> {
        let mut lengths = SplitMix64::new(seed ^ 0x6167_656e_7473);
        let per_agent: Vec<Vec<Vec<Vec<u32>>>> = (0..self.agents)
            .map(|agent| {
                Workload::Agentic(Agentic {
                    steps: self.rounds,
                    fanout: self.fanout,
                    system_prompt_tokens: self.system_prompt_tokens,
                    min_tokens: self.min_suffix_tokens,
                    max_tokens: self.max_suffix_tokens,
                })
                .generate(seed.wrapping_mul(1_000).wrapping_add(agent as u64))
            })
            .collect();
        (0..self.rounds)
            .map(|round| {
                let prompts = per_agent
                    .iter()
                    .flat_map(|steps| steps[round].clone())
                    .collect();
                requests_of(prompts, &self.output, &mut lengths)
            })
            .collect()
    }
}

/// One request's outcome at the client.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// From the step's start to sending it.
    pub sent_ms: f64,
    /// From sending to the first streamed byte (streamed requests only).
    pub ttft_ms: Option<f64>,
    /// From sending to the answer's end.
    pub latency_ms: f64,
    /// The answer's `usage.completion_tokens`.
    pub output_tokens: u64,
    pub error: Option<String>,
}

/// How a step is sent.
#[derive(Clone, Debug)]
pub struct Send {
    /// The route's front.
    pub url: String,
    /// Stream the answers (time to first token seen by the client) or not (as RL rollouts
    /// are collected: only the whole answer matters).
    pub stream: bool,
    pub timeout: Duration,
}

/// Sends every request of `step` at once and waits for every answer.
pub async fn send_step(client: &reqwest::Client, send: &Send, step: &[Request]) -> Vec<Outcome> {
    let started = Instant::now();
    let tasks: Vec<_> = step
        .iter()
        .map(|request| {
            let client = client.clone();
            let send = send.clone();
            let mut body = json!({
                "model": MODEL,
                "prompt": request.prompt,
                "max_tokens": request.max_tokens,
                "ignore_eos": true,
                "temperature": 1.0,
                "stream": send.stream,
            });
            if send.stream {
                body["stream_options"] = json!({"include_usage": true});
            }
            tokio::spawn(async move {
                let sent_ms = started.elapsed().as_secs_f64() * 1e3;
                match one(&client, &send, &body).await {
                    Ok((ttft, latency, output_tokens)) => Outcome {
                        sent_ms,
                        ttft_ms: ttft.map(|t| t.as_secs_f64() * 1e3),
                        latency_ms: latency.as_secs_f64() * 1e3,
                        output_tokens,
                        error: None,
                    },
                    Err(error) => Outcome {
                        sent_ms,
                        ttft_ms: None,
                        latency_ms: f64::NAN,
                        output_tokens: 0,
                        error: Some(format!("{error:#}")),
                    },
                }
            })
        })
        .collect();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|e| Outcome {
                sent_ms: f64::NAN,
                ttft_ms: None,
                latency_ms: f64::NAN,
                output_tokens: 0,
                error: Some(format!("the request's task failed: {e}")),
            })
        })
        .collect()
}

/// One request: (time to first byte if streamed, latency, output tokens).
async fn one(
    client: &reqwest::Client,
    send: &Send,
    body: &serde_json::Value,
) -> anyhow::Result<(Option<Duration>, Duration, u64)> {
    let url = format!("{}/v1/completions", send.url);
    let started = Instant::now();
    let response = client
        .post(&url)
        .json(body)
        .timeout(send.timeout)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let mut chunks = response.bytes_stream();
    let mut answer = Vec::new();
    let mut first = None;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.with_context(|| format!("reading the answer of {url}"))?;
        first.get_or_insert_with(|| started.elapsed());
        answer.extend_from_slice(&chunk);
    }
    let latency = started.elapsed();
    if !status.is_success() {
        anyhow::bail!(
            "{url} answered {status}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    let usage = if send.stream {
        usage::from_sse(&answer)
    } else {
        usage::from_completion(&answer)
    }
    .with_context(|| format!("the answer of {url}"))?;
    Ok((
        first.filter(|_| send.stream),
        latency,
        usage.completion_tokens,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths_are_long_tailed_and_bounded() {
        let lengths = OutputLengths {
            median: 128.0,
            sigma: 0.8,
            max: 1024,
        };
        let mut rng = SplitMix64::new(7);
        let mut drawn: Vec<u32> = (0..20_000).map(|_| lengths.draw(&mut rng)).collect();
        drawn.sort_unstable();
        let median = drawn[drawn.len() / 2];
        assert!((118..=138).contains(&median), "median {median}");
        // exp(0.8 * 2.326) = 6.4 times the median at the 99th percentile.
        let p99 = drawn[drawn.len() * 99 / 100];
        assert!((700..=950).contains(&p99), "p99 {p99}");
        assert!(drawn.iter().all(|&l| (1..=1024).contains(&l)));
    }

    #[test]
    fn an_rl_step_is_prompts_times_samples_sharing_a_system_prompt() {
        let workload = RlWorkload {
            shape: RlShape {
                prompts: 4,
                samples: 3,
            },
            steps: 2,
            system_prompt_tokens: 100,
            min_prompt_tokens: 1000,
            max_prompt_tokens: 4000,
            output: OutputLengths {
                median: 100.0,
                sigma: 1.0,
                max: 500,
            },
        };
        let steps = workload.steps(1);
        assert_eq!(steps.len(), 2);
        for step in &steps {
            assert_eq!(step.len(), 12);
            let mut distinct: Vec<&str> = step.iter().map(|r| r.prompt.as_str()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), 4);
            for request in step {
                assert!((1000..=4000).contains(&request.prompt_tokens));
                assert_eq!(request.prompt.split(' ').count(), request.prompt_tokens);
                assert_eq!(request.prompt[..50], step[0].prompt[..50]);
            }
        }
        assert_eq!(workload.steps(1), steps);
        assert_ne!(workload.steps(2), steps);
    }

    #[test]
    fn agents_fan_out_on_their_own_system_prompts() {
        let workload = AgentWorkload {
            agents: 3,
            fanout: 4,
            rounds: 2,
            system_prompt_tokens: 200,
            min_suffix_tokens: 10,
            max_suffix_tokens: 20,
            output: OutputLengths {
                median: 10.0,
                sigma: 0.5,
                max: 100,
            },
        };
        let rounds = workload.rounds(5);
        assert_eq!(rounds.len(), 2);
        let round = &rounds[0];
        assert_eq!(round.len(), 12);
        let head = |r: &Request| r.prompt.split(' ').take(200).collect::<Vec<_>>().join(" ");
        assert_eq!(head(&round[0]), head(&round[3]));
        assert_ne!(head(&round[0]), head(&round[4]));
        assert_eq!(head(&rounds[1][4]), head(&round[4]));
    }
}
