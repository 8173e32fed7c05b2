//! Synthetic, seeded workloads: steps of requests that arrive together, as token IDs.
//!
//! Within a step the arrival order is shuffled (seeded): real bursts arrive interleaved, and a
//! fixed order would let round-robin or least-loaded keep sessions on one replica by accident.

use burst_prefix_planner::{hash_prompts, BlockHash, BlockSpec, Prompt};

use crate::rng::SplitMix64;

/// Token IDs are drawn uniformly from this vocabulary (Llama 3's size).
pub const VOCABULARY: u32 = 128_256;

/// The model name that seeds every hash chain.
pub const MODEL: &str = "simulated-model";

/// One request's prompt.
pub type Tokens = Vec<u32>;

/// GRPO rollouts: each step draws `prompts` new prompts and sends each `samples` times at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grpo {
    pub steps: usize,
    pub prompts: usize,
    pub samples: usize,
    /// A chat template / instruction shared by every prompt (0 for none).
    pub shared_prefix_tokens: usize,
    /// Each prompt's own length after the shared prefix: uniform in `min_tokens..=max_tokens`.
    pub min_tokens: usize,
    pub max_tokens: usize,
}

/// Agentic fan-out: each step sends `fanout` requests at once, all starting with the same system
/// prompt, each with its own suffix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agentic {
    pub steps: usize,
    pub fanout: usize,
    pub system_prompt_tokens: usize,
    /// Suffix length: uniform in `min_tokens..=max_tokens`.
    pub min_tokens: usize,
    pub max_tokens: usize,
}

/// Multi-turn chat: `sessions` conversations, one turn each per step; a turn's prompt is the
/// previous turn's prompt plus new tokens (the previous reply and the next user message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Multiturn {
    /// Turns per session.
    pub steps: usize,
    pub sessions: usize,
    /// A system prompt shared by every session (0 for none).
    pub system_prompt_tokens: usize,
    /// Tokens each turn adds: uniform in `min_tokens..=max_tokens`.
    pub min_tokens: usize,
    pub max_tokens: usize,
}

/// Everything at once, on one cluster: rounds of three windows. Every window, each chat session
/// takes its next turn with probability 1/2 (turns trickle in, a few per window); the first
/// window of a round also carries a GRPO burst and the second an agent fan-out, each family on
/// its own shared prefix (chat system prompt, agent system prompt, GRPO template).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mixed {
    pub rounds: usize,
    pub grpo: Grpo,
    pub agentic: Agentic,
    pub multiturn: Multiturn,
}

impl Mixed {
    pub const WINDOWS_PER_ROUND: usize = 3;
}

/// A workload's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    Grpo(Grpo),
    Agentic(Agentic),
    Multiturn(Multiturn),
    Mixed(Mixed),
}

impl Workload {
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Grpo(_) => "grpo",
            Workload::Agentic(_) => "agentic",
            Workload::Multiturn(_) => "multiturn",
            Workload::Mixed(_) => "mixed",
        }
    }

    /// The longest prompt it can produce, in tokens.
    pub fn max_prompt_tokens(&self) -> usize {
        match self {
            Workload::Grpo(w) => w.shared_prefix_tokens + w.max_tokens,
            Workload::Agentic(w) => w.system_prompt_tokens + w.max_tokens,
            Workload::Multiturn(w) => w.system_prompt_tokens + w.steps * w.max_tokens,
            Workload::Mixed(w) => [
                w.grpo.shared_prefix_tokens + w.grpo.max_tokens,
                w.agentic.system_prompt_tokens + w.agentic.max_tokens,
                w.multiturn.system_prompt_tokens
                    + w.rounds * Mixed::WINDOWS_PER_ROUND * w.multiturn.max_tokens,
            ]
            .into_iter()
            .max()
            .unwrap_or(0),
        }
    }

    /// Steps of prompts, each step in (shuffled) arrival order.
    pub fn generate(&self, seed: u64) -> Vec<Vec<Tokens>> {
        let mut rng = SplitMix64::new(seed);
        let mut steps = match self {
            Workload::Grpo(w) => grpo(w, &mut rng),
            Workload::Agentic(w) => agentic(w, &mut rng),
            Workload::Multiturn(w) => multiturn(w, &mut rng),
            Workload::Mixed(w) => mixed(w, &mut rng),
        };
        for step in &mut steps {
            rng.shuffle(step);
        }
        steps
    }
}

fn grpo(w: &Grpo, rng: &mut SplitMix64) -> Vec<Vec<Tokens>> {
    let shared = rng.tokens(w.shared_prefix_tokens, VOCABULARY);
    (0..w.steps)
        .map(|_| {
            let mut step = Vec::with_capacity(w.prompts * w.samples);
            for _ in 0..w.prompts {
                let own = rng.between(w.min_tokens, w.max_tokens);
                let mut prompt = shared.clone();
                prompt.extend(rng.tokens(own, VOCABULARY));
                step.extend(std::iter::repeat_n(prompt, w.samples));
            }
            step
        })
        .collect()
}

fn agentic(w: &Agentic, rng: &mut SplitMix64) -> Vec<Vec<Tokens>> {
    let system = rng.tokens(w.system_prompt_tokens, VOCABULARY);
    (0..w.steps)
        .map(|_| {
            (0..w.fanout)
                .map(|_| {
                    let own = rng.between(w.min_tokens, w.max_tokens);
                    let mut prompt = system.clone();
                    prompt.extend(rng.tokens(own, VOCABULARY));
                    prompt
                })
                .collect()
        })
        .collect()
}

fn multiturn(w: &Multiturn, rng: &mut SplitMix64) -> Vec<Vec<Tokens>> {
    let system = rng.tokens(w.system_prompt_tokens, VOCABULARY);
    let mut histories = vec![system; w.sessions];
    (0..w.steps)
        .map(|_| {
            histories
                .iter_mut()
                .map(|history| {
                    let added = rng.between(w.min_tokens, w.max_tokens);
                    history.extend(rng.tokens(added, VOCABULARY));
                    history.clone()
                })
                .collect()
        })
        .collect()
}

fn mixed(w: &Mixed, rng: &mut SplitMix64) -> Vec<Vec<Tokens>> {
    let template = rng.tokens(w.grpo.shared_prefix_tokens, VOCABULARY);
    let agent_system = rng.tokens(w.agentic.system_prompt_tokens, VOCABULARY);
    let chat_system = rng.tokens(w.multiturn.system_prompt_tokens, VOCABULARY);
    let mut histories = vec![chat_system; w.multiturn.sessions];
    (0..w.rounds * Mixed::WINDOWS_PER_ROUND)
        .map(|window| {
            let mut step = Vec::new();
            for history in &mut histories {
                if rng.below(2) == 0 {
                    let added = rng.between(w.multiturn.min_tokens, w.multiturn.max_tokens);
                    history.extend(rng.tokens(added, VOCABULARY));
                    step.push(history.clone());
                }
            }
            match window % Mixed::WINDOWS_PER_ROUND {
                0 => {
                    for _ in 0..w.grpo.prompts {
                        let own = rng.between(w.grpo.min_tokens, w.grpo.max_tokens);
                        let mut prompt = template.clone();
                        prompt.extend(rng.tokens(own, VOCABULARY));
                        step.extend(std::iter::repeat_n(prompt, w.grpo.samples));
                    }
                }
                1 => {
                    for _ in 0..w.agentic.fanout {
                        let own = rng.between(w.agentic.min_tokens, w.agentic.max_tokens);
                        let mut prompt = agent_system.clone();
                        prompt.extend(rng.tokens(own, VOCABULARY));
                        step.push(prompt);
                    }
                }
                _ => {}
            }
            step
        })
        .collect()
}

/// A request as the cluster sees it: its block hashes (the real [`hash_prompts`]) and the
/// tokens in each block (the block size, less for the trailing partial block).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashedRequest {
    pub blocks: Vec<BlockHash>,
    pub block_tokens: Vec<u64>,
}

impl HashedRequest {
    /// Hashes one prompt. `tokens` must fit in `spec.max_blocks` blocks, so that every token
    /// belongs to a block the cache can hold (checked).
    pub fn new(tokens: &[u32], spec: BlockSpec) -> Self {
        let block = spec.block_size_tokens;
        assert!(
            tokens.len() <= spec.max_blocks * block,
            "prompt of {} tokens exceeds the {}-block hash cap",
            tokens.len(),
            spec.max_blocks
        );
        let blocks = hash_prompts(MODEL, "", &[Prompt::Tokens(tokens)], spec)
            .pop()
            .unwrap_or_default();
        let block_tokens = (0..blocks.len())
            .map(|i| (tokens.len() - i * block).min(block) as u64)
            .collect();
        HashedRequest {
            blocks,
            block_tokens,
        }
    }

    /// Prompt tokens.
    pub fn tokens(&self) -> u64 {
        self.block_tokens.iter().sum()
    }
}

/// Hashes every prompt of every step.
pub fn hash_steps(steps: &[Vec<Tokens>], spec: BlockSpec) -> Vec<Vec<HashedRequest>> {
    steps
        .iter()
        .map(|step| {
            step.iter()
                .map(|tokens| HashedRequest::new(tokens, spec))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpo_workload() -> Workload {
        Workload::Grpo(Grpo {
            steps: 2,
            prompts: 3,
            samples: 4,
            shared_prefix_tokens: 0,
            min_tokens: 5,
            max_tokens: 9,
        })
    }

    #[test]
    fn grpo_repeats_each_prompt_samples_times() {
        let steps = grpo_workload().generate(1);
        assert_eq!(steps.len(), 2);
        for step in &steps {
            assert_eq!(step.len(), 12);
            let mut distinct = step.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 3);
            for prompt in &distinct {
                assert_eq!(step.iter().filter(|p| *p == prompt).count(), 4);
                assert!((5..=9).contains(&prompt.len()));
            }
        }
    }

    #[test]
    fn same_seed_same_workload() {
        assert_eq!(grpo_workload().generate(3), grpo_workload().generate(3));
        assert_ne!(grpo_workload().generate(3), grpo_workload().generate(4));
    }

    #[test]
    fn multiturn_prompts_grow_by_turn() {
        let workload = Workload::Multiturn(Multiturn {
            steps: 3,
            sessions: 2,
            system_prompt_tokens: 4,
            min_tokens: 2,
            max_tokens: 3,
        });
        let steps = workload.generate(9);
        for session in &steps[1] {
            // Each turn-2 prompt extends exactly one turn-1 prompt.
            let parents = steps[0]
                .iter()
                .filter(|p| session.starts_with(p) && session.len() > p.len())
                .count();
            assert_eq!(parents, 1);
        }
        assert!(workload.max_prompt_tokens() >= steps[2].iter().map(Vec::len).max().unwrap());
    }

    #[test]
    fn agentic_shares_the_system_prompt() {
        let steps = Workload::Agentic(Agentic {
            steps: 1,
            fanout: 5,
            system_prompt_tokens: 8,
            min_tokens: 1,
            max_tokens: 4,
        })
        .generate(2);
        let head = &steps[0][0][..8];
        assert!(steps[0].iter().all(|p| &p[..8] == head));
    }

    #[test]
    fn mixed_interleaves_bursts_fan_outs_and_trickling_turns() {
        let workload = Workload::Mixed(Mixed {
            rounds: 2,
            grpo: Grpo {
                steps: 0,
                prompts: 2,
                samples: 3,
                shared_prefix_tokens: 4,
                min_tokens: 1,
                max_tokens: 2,
            },
            agentic: Agentic {
                steps: 0,
                fanout: 5,
                system_prompt_tokens: 8,
                min_tokens: 1,
                max_tokens: 2,
            },
            multiturn: Multiturn {
                steps: 0,
                sessions: 40,
                system_prompt_tokens: 6,
                min_tokens: 1,
                max_tokens: 2,
            },
        });
        let steps = workload.generate(5);
        assert_eq!(steps.len(), 6);
        let turns = |step: &Vec<Tokens>| step.len();
        // A burst (6) or a fan-out (5) on top of about half of the 40 sessions' turns.
        for (i, step) in steps.iter().enumerate() {
            let extra = [6, 5, 0][i % 3];
            assert!(
                (5..=35).contains(&(turns(step) - extra)),
                "window {i}: {}",
                step.len()
            );
        }
        assert!(
            workload.max_prompt_tokens() >= steps.iter().flatten().map(Vec::len).max().unwrap()
        );
    }

    #[test]
    fn block_tokens_keep_the_trailing_partial_block() {
        let tokens: Vec<u32> = (1..=10).collect();
        let request = HashedRequest::new(&tokens, BlockSpec::new(4, 0));
        assert_eq!(
            request.blocks,
            hash_prompts(MODEL, "", &[Prompt::Tokens(&tokens)], BlockSpec::new(4, 0))[0]
        );
        assert_eq!(request.block_tokens, vec![4, 4, 2]);
        assert_eq!(request.tokens(), 10);
        assert!(HashedRequest::new(&[], BlockSpec::new(4, 0))
            .blocks
            .is_empty());
    }
}
