//! The bench's workloads: the simulator's own generators ([`burst_prefix_simulator::workload`]),
//! at sizes a tiny model on 2 shared cores runs in minutes, with token IDs folded into the
//! engine's vocabulary. The simulator is then run on exactly the folded tokens, so the two see
//! the same prompts.

use burst_prefix_simulator::workload::{Agentic, Grpo, Mixed, Multiturn, Tokens, Workload};

/// Token IDs below this are the model's control tokens (`<unk>`, `<s>`, `</s>`), never sent.
pub const FIRST_ORDINARY_TOKEN: u32 = 3;

/// The workloads of the bench, by name.
pub fn bench_workloads() -> Vec<Workload> {
    vec![
        // A GRPO step: 8 prompts x 4 samples at once, 2 steps.
        Workload::Grpo(Grpo {
            steps: 2,
            prompts: 8,
            samples: 4,
            shared_prefix_tokens: 0,
            min_tokens: 256,
            max_tokens: 768,
        }),
        // 8 chat sessions on one 512-token system prompt, 4 turns, each resending its history.
        Workload::Multiturn(Multiturn {
            steps: 4,
            sessions: 8,
            system_prompt_tokens: 512,
            min_tokens: 64,
            max_tokens: 192,
        }),
        // Agent fan-outs: 16 requests at once on one 1,024-token system prompt, 2 steps.
        Workload::Agentic(Agentic {
            steps: 2,
            fanout: 16,
            system_prompt_tokens: 1024,
            min_tokens: 64,
            max_tokens: 256,
        }),
        // The mixed workload of memory across windows (docs/behaviour.md §7; the simulator's
        // `Mixed`), 2 rounds of 3 windows: chat turns trickling in from 8 sessions (512-token
        // system prompt), a GRPO burst of 4 prompts x 4 samples (128-token template) in a
        // round's first window and an agent fan-out of 8 (1,024-token system prompt) in its
        // second.
        Workload::Mixed(Mixed {
            rounds: 2,
            grpo: Grpo {
                steps: 1,
                prompts: 4,
                samples: 4,
                shared_prefix_tokens: 128,
                min_tokens: 256,
                max_tokens: 512,
            },
            agentic: Agentic {
                steps: 1,
                fanout: 8,
                system_prompt_tokens: 1024,
                min_tokens: 64,
                max_tokens: 256,
            },
            multiturn: Multiturn {
                steps: 1,
                sessions: 8,
                system_prompt_tokens: 512,
                min_tokens: 64,
                max_tokens: 128,
            },
        }),
    ]
}

/// Folds the simulator's token IDs into `vocabulary` (the engine's), past the control tokens.
/// Sharing is kept: prompts equal before are equal after, and distinct random prompts stay
/// distinct after their first few tokens.
pub fn fold_into_vocabulary(steps: Vec<Vec<Tokens>>, vocabulary: u32) -> Vec<Vec<Tokens>> {
    assert!(
        vocabulary > FIRST_ORDINARY_TOKEN + 1,
        "a vocabulary of {vocabulary} tokens"
    );
    let ordinary = vocabulary - FIRST_ORDINARY_TOKEN;
    steps
        .into_iter()
        .map(|step| {
            step.into_iter()
                .map(|prompt| {
                    prompt
                        .into_iter()
                        .map(|t| FIRST_ORDINARY_TOKEN + t % ordinary)
                        .collect()
                })
                .collect()
        })
        .collect()
}
