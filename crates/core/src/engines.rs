//! What the engines say themselves (docs/behaviour.md §7, "What the engines say"): the blocks
//! each replica's engine really holds (its KV events, indexed by token ids), the model's
//! tokenizer (so that text and chat prompts are hashed as the engine's tokens), and each
//! replica's load. The feeds that fill this (the ZMQ subscriber, the `/metrics` scraper) are
//! adapters in `crate::engine_feeds`; the core only reads it.
//!
//! How it meets the planner: a request's token ids are looked up in the engine index, and the
//! leading blocks a replica's engine holds are touched in that replica's memory model (queued
//! here, applied under the planning lock before the next plan). So a replica's match is the
//! larger of what the engine holds and what we placed there: the events are the truth about the
//! past, our placements the prediction for the requests still in flight. A replica the engine
//! cleared (a reset, a weight update, a restart) loses its model.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use burst_prefix_engine_state::speed::{Counters, SpeedLearner, Verdict};
use burst_prefix_engine_state::tokenizer::{ChatOptions, Tokenizer};
use burst_prefix_engine_state::{EngineIndex, IndexConfig};
use burst_prefix_planner::AnswerBook;
use burst_prefix_planner::{BlockHash, Memory, Prompt, Speed};
use prometheus::{IntCounterVec, Opts, Registry};

/// Engine blocks kept per replica at most (past it, its oldest stored block goes first).
const INDEX_BLOCKS_PER_REPLICA: usize = 1 << 18;

pub struct Engines {
    index: Mutex<EngineIndex>,
    /// The tokenizer and the directory it was read from.
    tokenizer: RwLock<Option<(PathBuf, Arc<Tokenizer>)>>,
    pending: Mutex<Pending>,
    /// Per endpoint id, the requests its engine runs and queues, from its `/metrics`.
    load: RwLock<HashMap<String, u64>>,
    /// Endpoint ids whose `/metrics` were scraped at least once, answered or not.
    scraped: RwLock<HashSet<String>>,
    /// Per endpoint id, its speed as learned from its `/metrics` counters, and the class of
    /// what it last taught (for the log line when that changes).
    speeds: RwLock<HashMap<String, (SpeedLearner, Learning)>>,
    /// Per endpoint id, the address its learned state was learned at.
    addresses: Mutex<HashMap<String, String>>,
    /// Bumped whenever a load or a speed changes (placers that cache them look again).
    heard: AtomicU64,
    /// The weight version the latest request named (`x-burst-prefix-weight-version`).
    weight_version: Mutex<Option<String>>,
    outcomes: IntCounterVec,
}

/// What waits for the planning lock: engine holdings to touch, models to drop.
#[derive(Default)]
struct Pending {
    touches: Vec<(String, Vec<BlockHash>)>,
    clears: Vec<String>,
    clear_all: bool,
}

/// Why a request's prompt could not be tokenized: hashed as estimates instead.
const OUTCOMES: [&str; 4] = ["tokenized", "tokenize_failed", "engine_matched", "reset"];

impl Engines {
    pub fn new(registry: &Registry) -> Self {
        let outcomes = IntCounterVec::new(
            Opts::new(
                "burst_prefix_engine_state_total",
                "What the engines' own state did for requests: tokenized (hashed as the engine's tokens), tokenize_failed (hashed as estimates), engine_matched (a replica's engine held a leading run), reset (memory dropped: a reset call, a weight update, an engine that cleared its cache)",
            ),
            &["outcome"],
        )
        .expect("a valid metric");
        for outcome in OUTCOMES {
            outcomes.with_label_values(&[outcome]);
        }
        registry
            .register(Box::new(outcomes.clone()))
            .expect("registered once");
        Engines {
            index: Mutex::new(EngineIndex::new(IndexConfig {
                capacity_per_replica: INDEX_BLOCKS_PER_REPLICA,
            })),
            tokenizer: RwLock::new(None),
            pending: Mutex::new(Pending::default()),
            load: RwLock::new(HashMap::new()),
            scraped: RwLock::new(HashSet::new()),
            speeds: RwLock::new(HashMap::new()),
            addresses: Mutex::new(HashMap::new()),
            heard: AtomicU64::new(0),
            weight_version: Mutex::new(None),
            outcomes,
        }
    }

    /// The engine index, for the KV-events feed.
    pub fn index(&self) -> MutexGuard<'_, EngineIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Uses the tokenizer in `dir` (`None`: none), reading it only when the directory changed.
    pub fn use_tokenizer(&self, dir: Option<&Path>) -> Result<(), String> {
        let mut current = self.tokenizer.write().unwrap_or_else(|p| p.into_inner());
        match dir {
            None => *current = None,
            Some(dir) if current.as_ref().is_some_and(|(path, _)| path == dir) => {}
            Some(dir) => {
                let tokenizer = Tokenizer::from_dir(dir)
                    .map_err(|e| format!("tokenizer {}: {e}", dir.display()))?;
                *current = Some((dir.to_path_buf(), Arc::new(tokenizer)));
            }
        }
        Ok(())
    }

    fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.tokenizer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, tokenizer)| tokenizer.clone())
    }

    /// A request's prompts as the engine's token ids, when a tokenizer is in use (token-id
    /// prompts pass as they are); `None` hashes them as estimates. `body` is the request's,
    /// read again for a chat's messages and tools (`chat`).
    pub fn token_prompts(
        &self,
        body: &[u8],
        chat: bool,
        prompts: &[Prompt<'_>],
    ) -> Option<Vec<Vec<u32>>> {
        let tokenizer = self.tokenizer()?;
        let tokenized = if chat {
            chat_tokens(&tokenizer, body).map(|ids| vec![ids])
        } else {
            prompts
                .iter()
                .map(|prompt| match prompt {
                    Prompt::Tokens(ids) => Ok(ids.to_vec()),
                    Prompt::Text(text) => {
                        tokenizer.encode_completion(text).map_err(|e| e.to_string())
                    }
                })
                .collect()
        };
        match tokenized {
            Ok(prompts) => {
                self.count("tokenized");
                Some(prompts)
            }
            Err(error) => {
                tracing::debug!(%error, "cannot tokenize; hashing the prompt as estimates");
                self.count("tokenize_failed");
                None
            }
        }
    }

    /// Looks `tokens` (one prompt's, the engine's ids) up in the engine index, and queues the
    /// leading run of `blocks` (the same prompt's chain at `block_size` tokens) each replica's
    /// engine holds, to be touched in its memory model.
    pub fn note_held(&self, tokens: &[u32], blocks: &[BlockHash], block_size: usize) {
        if tokens.is_empty() || block_size == 0 {
            return;
        }
        let touches: Vec<(String, Vec<BlockHash>)> = {
            let index = self.index();
            if index.replicas().next().is_none() {
                return;
            }
            index
                .held(tokens)
                .into_iter()
                .filter_map(|held| {
                    let ours = (held.tokens() / block_size).min(blocks.len());
                    (ours > 0).then(|| (held.replica.to_string(), blocks[..ours].to_vec()))
                })
                .collect()
        };
        if !touches.is_empty() {
            self.count("engine_matched");
            self.pending().touches.extend(touches);
        }
    }

    /// Forgets what `replicas` hold (`None`: every replica): their engine blocks now, their
    /// memory models at the next plan. A reset, a weight update, an engine's own clear.
    pub fn reset(&self, replicas: Option<&[String]>) {
        self.count("reset");
        let mut index = self.index();
        let mut pending = self.pending();
        match replicas {
            None => {
                index.clear_all();
                pending.touches.clear();
                pending.clear_all = true;
            }
            Some(replicas) => {
                for replica in replicas {
                    index.clear(replica);
                }
                pending.touches.retain(|(id, _)| !replicas.contains(id));
                pending.clears.extend(replicas.iter().cloned());
            }
        }
    }

    /// A request names the weights it was made for: a new version drops what every replica
    /// was said to hold under the older one.
    pub fn weights(&self, version: &str) {
        let changed = {
            let mut current = self
                .weight_version
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let changed = current.as_deref().is_some_and(|v| v != version);
            if current.as_deref() != Some(version) {
                *current = Some(version.to_string());
            }
            changed
        };
        if changed {
            tracing::info!(version, "new weights: every replica's cache is forgotten");
            self.reset(None);
        }
    }

    /// Applies what waits (touches, drops) to `memory`, and a drop of everything to the
    /// answers learned too; true when anything was touched (the caller settles before
    /// planning with it).
    pub fn apply_pending(&self, memory: Option<&mut Memory>, answers: &mut AnswerBook) -> bool {
        let pending = std::mem::take(&mut *self.pending());
        if pending.clear_all {
            answers.clear();
        }
        let Some(memory) = memory else {
            return false;
        };
        if pending.clear_all {
            memory.retain_replicas(|_| false);
        } else if !pending.clears.is_empty() {
            memory.retain_replicas(|id| !pending.clears.iter().any(|gone| gone == id));
        }
        for (replica, blocks) in &pending.touches {
            memory.touch_replica(replica, blocks);
        }
        !pending.touches.is_empty()
    }

    /// Records one scrape of `endpoint`'s engine load (requests running and waiting); `None`:
    /// unknown (the scrape failed).
    pub fn set_load(&self, endpoint: &str, load: Option<u64>) {
        let mut scraped = self.scraped.write().unwrap_or_else(|p| p.into_inner());
        if !scraped.contains(endpoint) {
            scraped.insert(endpoint.to_string());
        }
        drop(scraped);
        let mut loads = self.load.write().unwrap_or_else(|p| p.into_inner());
        match load {
            Some(load) => {
                loads.insert(endpoint.to_string(), load);
            }
            None => {
                loads.remove(endpoint);
            }
        }
        self.heard.fetch_add(1, Ordering::Relaxed);
    }

    /// One scrape of `endpoint`'s counters, read at `at` seconds (a monotonic clock), to learn
    /// its speed from; says what it did (a rejected scrape is counted by the caller). A log line
    /// says when what the replica teaches changes class.
    pub fn observe_speed(&self, endpoint: &str, counters: Counters, at: f64) -> Verdict {
        let mut speeds = self.speeds.write().unwrap_or_else(|p| p.into_inner());
        let (learner, class) = speeds
            .entry(endpoint.to_string())
            .or_insert_with(|| (SpeedLearner::new(), Learning::Prior));
        let verdict = learner.observe(counters, at);
        let now = match verdict {
            Verdict::Rejected(_) => Learning::Rejected,
            Verdict::Reset => Learning::Reset,
            Verdict::Learned => Learning::Learned,
            Verdict::Baseline if learner.relaxed() && *class != Learning::Prior => {
                Learning::Reprobed
            }
            Verdict::Baseline => *class,
        };
        if now != *class {
            let speed = learner.speed(Speed::default());
            match verdict {
                Verdict::Rejected(what) => tracing::warn!(
                    endpoint,
                    what,
                    "engine speed: a /metrics scrape moved more than an engine can; rejected"
                ),
                _ => tracing::info!(endpoint, learning = now.label(), ?speed, "engine speed"),
            }
            *class = now;
        }
        drop(speeds);
        self.heard.fetch_add(1, Ordering::Relaxed);
        verdict
    }

    /// `endpoint`'s speed: learned from its counters, `prior` until enough was seen.
    pub fn speed(&self, endpoint: &str, prior: Speed) -> Speed {
        self.speeds
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(endpoint)
            .map_or(prior, |(learner, _)| learner.speed(prior))
    }

    /// Follows the endpoints in force (`(id, address)`): what was learned of an endpoint that
    /// left, or whose address changed (another engine), is forgotten.
    pub fn follow_endpoints<'a>(&self, endpoints: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let now: HashMap<String, String> = endpoints
            .into_iter()
            .map(|(id, address)| (id.to_string(), address.to_string()))
            .collect();
        let mut addresses = self.addresses.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = addresses
            .iter()
            .filter(|(id, address)| now.get(*id) != Some(*address))
            .map(|(id, _)| id.clone())
            .collect();
        *addresses = now;
        drop(addresses);
        if !gone.is_empty() {
            self.forget_learned(Some(&gone));
        }
    }

    /// Forgets what was learned of `endpoints` (`None`: of every endpoint): their speeds and
    /// loads (`POST /v1/memory/reset`, an endpoint that left or moved).
    pub fn forget_learned(&self, endpoints: Option<&[String]>) {
        let mut speeds = self.speeds.write().unwrap_or_else(|p| p.into_inner());
        let mut loads = self.load.write().unwrap_or_else(|p| p.into_inner());
        match endpoints {
            None => {
                speeds.clear();
                loads.clear();
            }
            Some(endpoints) => {
                for id in endpoints {
                    if speeds.remove(id).is_some() {
                        tracing::info!(endpoint = id.as_str(), learning = "reset", "engine speed");
                    }
                    loads.remove(id);
                }
            }
        }
        self.heard.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes with every load or speed heard: equal values mean nothing new.
    pub fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// Whether `endpoint`'s `/metrics` were scraped at least once, answered or failed.
    pub fn scraped(&self, endpoint: &str) -> bool {
        self.scraped
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(endpoint)
    }

    /// `endpoint`'s engine load, when its `/metrics` are read.
    pub fn load(&self, endpoint: &str) -> Option<u64> {
        self.load
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(endpoint)
            .copied()
    }

    fn count(&self, outcome: &str) {
        self.outcomes.with_label_values(&[outcome]).inc();
    }
}

/// The class of what a replica's `/metrics` teach its speed, logged when it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Learning {
    /// Nothing yet (the prior stands).
    Prior,
    Learned,
    /// Its last scrape was rejected.
    Rejected,
    /// A counter went back or came back: a new baseline.
    Reset,
    /// It showed no work long enough for the prior to stand again: it is tried again.
    Reprobed,
}

impl Learning {
    fn label(self) -> &'static str {
        match self {
            Learning::Prior => "prior",
            Learning::Learned => "learned",
            Learning::Rejected => "rejected",
            Learning::Reset => "reset",
            Learning::Reprobed => "re-probed",
        }
    }
}

/// A chat body's messages and tools, rendered with the model's chat template and tokenized as
/// vLLM does for `/v1/chat/completions`.
fn chat_tokens(tokenizer: &Tokenizer, body: &[u8]) -> Result<Vec<u32>, String> {
    let body: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let messages = body
        .get("messages")
        .ok_or_else(|| "no messages".to_string())?;
    let mut options = ChatOptions::chat_completions();
    options.tools = body.get("tools").filter(|tools| !tools.is_null());
    options.template_kwargs = body.get("chat_template_kwargs").and_then(|k| k.as_object());
    if let Some(add) = body.get("add_generation_prompt").and_then(|a| a.as_bool()) {
        options.add_generation_prompt = add;
    }
    tokenizer
        .encode_chat(messages, &options)
        .map_err(|e| e.to_string())
}
