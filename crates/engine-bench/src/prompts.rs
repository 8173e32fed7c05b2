//! The workloads' prompts as clients send them: text, to `/v1/completions` or, for a
//! conversation's turns, to `/v1/chat/completions` (vLLM), or as token IDs (llama.cpp, whose
//! bench model's vocabulary is too small for text to keep its size).
//!
//! Both peer routers build their prefix trees from a request's text, so prompts must be text for
//! them to be measured fairly. A simulator token becomes one word; a token prefix becomes a text
//! prefix that ends on a word boundary, which a byte-level BPE tokenizer splits at, so prompts
//! that share tokens share text and the engine's tokens of that text.

use serde::Serialize;
use serde_json::{json, Value};

/// Syllables of the corpus the tiny vLLM model's tokenizer was trained on
/// (tests/vllm/write_model.py): a word of two of them is about one token (1.09 measured).
const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ne", "ra", "tu", "shi", "po", "ven", "dor", "al", "ex", "qu", "ib", "zor",
    "fen", "gal", "hum", "jet", "wix", "ur", "oy", "ze", "bri",
];

/// The word that stands for a simulator token.
fn word(token: u32) -> String {
    let n = SYLLABLES.len() as u32;
    let i = token % (n * n);
    format!(
        "{}{}",
        SYLLABLES[(i / n) as usize],
        SYLLABLES[(i % n) as usize]
    )
}

/// Tokens as words, one space between them.
pub fn text(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|&t| word(t))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A text of `count` words (about 1.09 tokens each on the tiny model), distinct per `seed`: the
/// tests on real engines build their prompts with it.
pub fn words(seed: u32, count: u32) -> String {
    let tokens: Vec<u32> = (0..count)
        .map(|i| {
            seed.wrapping_mul(7_919)
                .wrapping_add(i.wrapping_mul(104_729))
                % 100_003
        })
        .collect();
    text(&tokens)
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// A prompt, in the shape the request sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Tokens(Vec<u32>),
    Text(String),
    Chat(Vec<Message>),
}

impl Prompt {
    pub fn path(&self) -> &'static str {
        match self {
            Prompt::Tokens(_) | Prompt::Text(_) => "/v1/completions",
            Prompt::Chat(_) => "/v1/chat/completions",
        }
    }

    /// The request body's prompt fields (`prompt`, or `messages`).
    pub fn fields(&self) -> Value {
        match self {
            Prompt::Tokens(tokens) => json!({ "prompt": tokens }),
            Prompt::Text(text) => json!({ "prompt": text }),
            Prompt::Chat(messages) => json!({ "messages": messages }),
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub prompt: Prompt,
    /// The conversation it is a turn of (one that has at least two turns), if any.
    pub session: Option<usize>,
}

/// Per step, the conversation each prompt is a turn of: a prompt continues a conversation when
/// the conversation's last turn (in an earlier step) is a strict prefix of it. Conversations of
/// one turn are none.
pub fn sessions(steps: &[Vec<Vec<u32>>]) -> Vec<Vec<Option<usize>>> {
    // (conversation, its last turn, the step of that turn)
    let mut open: Vec<(usize, &[u32], usize)> = Vec::new();
    let mut turns: Vec<usize> = Vec::new();
    let ids: Vec<Vec<usize>> = steps
        .iter()
        .enumerate()
        .map(|(step, prompts)| {
            prompts
                .iter()
                .map(|prompt| {
                    let continued = open.iter_mut().find(|(_, last, at)| {
                        *at < step && prompt.len() > last.len() && prompt.starts_with(last)
                    });
                    match continued {
                        Some((id, last, at)) => {
                            *last = prompt;
                            *at = step;
                            turns[*id] += 1;
                            *id
                        }
                        None => {
                            open.push((turns.len(), prompt, step));
                            turns.push(1);
                            turns.len() - 1
                        }
                    }
                })
                .collect()
        })
        .collect();
    // Renumber the conversations of two turns or more 0, 1, ... in order of appearance.
    let mut numbers = vec![None; turns.len()];
    let mut next = 0;
    ids.into_iter()
        .map(|step| {
            step.into_iter()
                .map(|id| {
                    if turns[id] < 2 {
                        return None;
                    }
                    Some(*numbers[id].get_or_insert_with(|| {
                        next += 1;
                        next - 1
                    }))
                })
                .collect()
        })
        .collect()
}

/// The workload as token IDs, to `/v1/completions`.
pub fn as_tokens(steps: &[Vec<Vec<u32>>]) -> Vec<Vec<Request>> {
    let sessions = sessions(steps);
    steps
        .iter()
        .zip(sessions)
        .map(|(step, sessions)| {
            step.iter()
                .zip(sessions)
                .map(|(prompt, session)| Request {
                    prompt: Prompt::Tokens(prompt.clone()),
                    session,
                })
                .collect()
        })
        .collect()
}

/// The workload as text: a conversation's turns as chat (the prefix its first turns share as
/// the system message; its first chunk a user message; each later chunk the assistant's answer
/// and the user's next message, split in half), every other prompt as a completion's text.
pub fn as_text(steps: &[Vec<Vec<u32>>]) -> Vec<Vec<Request>> {
    let sessions = sessions(steps);
    let system_len = system_prompt_len(steps, &sessions);
    let mut histories: Vec<Vec<Message>> = Vec::new();
    let mut lengths: Vec<usize> = Vec::new();
    steps
        .iter()
        .zip(sessions)
        .map(|(step, sessions)| {
            step.iter()
                .zip(sessions)
                .map(|(prompt, session)| {
                    let Some(id) = session else {
                        return Request {
                            prompt: Prompt::Text(text(prompt)),
                            session,
                        };
                    };
                    if id == histories.len() {
                        let system = &prompt[..system_len];
                        let mut messages = Vec::new();
                        if !system.is_empty() {
                            messages.push(message("system", system));
                        }
                        messages.push(message("user", &prompt[system_len..]));
                        histories.push(messages);
                        lengths.push(prompt.len());
                    } else {
                        let chunk = &prompt[lengths[id]..];
                        let (answer, question) = chunk.split_at(chunk.len() / 2);
                        histories[id].push(message("assistant", answer));
                        histories[id].push(message("user", question));
                        lengths[id] = prompt.len();
                    }
                    Request {
                        prompt: Prompt::Chat(histories[id].clone()),
                        session,
                    }
                })
                .collect()
        })
        .collect()
}

fn message(role: &'static str, tokens: &[u32]) -> Message {
    Message {
        role,
        content: text(tokens),
    }
}

/// The tokens every conversation's first turn starts with (their system prompt), when there are
/// two conversations or more; 0 otherwise.
fn system_prompt_len(steps: &[Vec<Vec<u32>>], sessions: &[Vec<Option<usize>>]) -> usize {
    let mut seen = std::collections::HashSet::new();
    let firsts: Vec<&[u32]> = steps
        .iter()
        .zip(sessions)
        .flat_map(|(step, sessions)| step.iter().zip(sessions))
        .filter_map(|(prompt, session)| session.filter(|id| seen.insert(*id)).map(|_| &prompt[..]))
        .collect();
    let [first, rest @ ..] = &firsts[..] else {
        return 0;
    };
    if rest.is_empty() {
        return 0;
    }
    rest.iter().fold(first.len(), |len, other| {
        first[..len]
            .iter()
            .zip(other.iter())
            .take_while(|(a, b)| a == b)
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_prefix_is_a_text_prefix_on_a_word_boundary() {
        let long = text(&[1, 2, 3, 600]);
        let short = text(&[1, 2]);
        assert!(long.starts_with(&format!("{short} ")));
        assert_ne!(text(&[1]), text(&[2]));
        // Tokens beyond the words' count fold onto them.
        assert_eq!(text(&[5]), text(&[5 + 576]));
    }

    #[test]
    fn turns_that_extend_an_earlier_turn_are_one_conversation() {
        let steps = vec![
            vec![vec![9, 1], vec![9, 2], vec![7, 7], vec![7, 7]],
            vec![vec![9, 2, 5], vec![9, 1, 4], vec![8]],
            vec![vec![9, 1, 4, 6]],
        ];
        assert_eq!(
            sessions(&steps),
            vec![
                vec![Some(0), Some(1), None, None],
                vec![Some(1), Some(0), None],
                vec![Some(0)],
            ]
        );
    }

    #[test]
    fn conversations_are_chats_that_resend_their_history() {
        let system = [1, 2, 3];
        let a1: Vec<u32> = system.iter().copied().chain([10]).collect();
        let b1: Vec<u32> = system.iter().copied().chain([20]).collect();
        let a2: Vec<u32> = a1.iter().copied().chain([11, 12, 13, 14]).collect();
        let b2: Vec<u32> = b1.iter().copied().chain([21, 22]).collect();
        let grpo = vec![40, 41];
        let steps = vec![vec![a1, b1, grpo.clone()], vec![b2, a2, grpo.clone()]];
        let requests = as_text(&steps);
        let Prompt::Chat(a2) = &requests[1][1].prompt else {
            panic!("a chat: {:?}", requests[1][1]);
        };
        let roles: Vec<&str> = a2.iter().map(|m| m.role).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(a2[0].content, text(&system));
        assert_eq!(a2[1].content, text(&[10]));
        assert_eq!(a2[2].content, text(&[11, 12]));
        assert_eq!(a2[3].content, text(&[13, 14]));
        let Prompt::Chat(a1) = &requests[0][0].prompt else {
            panic!("a chat");
        };
        assert_eq!(a2[..2], a1[..], "a turn resends the previous one");
        assert_eq!(requests[0][2].prompt, Prompt::Text(text(&grpo)));
        assert_eq!(requests[0][2].session, None);
        assert_eq!(requests[1][0].session, Some(1));
        assert_eq!(requests[1][0].prompt.path(), "/v1/chat/completions");
    }
}
