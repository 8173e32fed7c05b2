//! The planner configuration (docs/behaviour.md §2) and its one validation function.
//!
//! [`RULES`] is the single source of truth for what a valid config is: [`PlannerConfig::validate`]
//! runs it in the operator and the producer, and the CRD schema carries the same rules as CEL
//! (`x-kubernetes-validations`), with the plain ranges also expressed as OpenAPI bounds from the
//! same constants.

use std::fmt;

use std::num::NonZeroUsize;

use burst_prefix_planner::{BlockSpec, MemorySettings, PlanParams, Speed};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// 0 is zero-wait mode: no window, each request placed as it arrives.
pub const WINDOW_DURATION_MS_MIN: i64 = 0;
pub const WINDOW_DURATION_MS_MAX: i64 = 10_000;
/// -1 means unlimited for `maxPerReplica` and `maxBatchSize`.
pub const UNLIMITED: i64 = -1;
/// The longest `memory.loadHalfLifeMs`: an hour.
pub const LOAD_HALF_LIFE_MS_MAX: i64 = 3_600_000;
/// The longest `engines.loadIntervalMs`: a minute.
pub const LOAD_INTERVAL_MS_MAX: i64 = 60_000;

/// How the planner balances load across replicas. Unset: `time` with memory (the default), in a
/// window as on arrival, since each request then goes where it is answered first; `requests`
/// without memory (exactly as llm-d places). In a window every mode gives a request that shares
/// nothing no affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BalanceBy {
    /// Count requests per replica.
    Requests,
    /// Count blocks to prefill per replica; a prefix shared on a replica is charged once.
    Tokens,
    /// Seconds: each request goes where it is predicted to be answered first, counting the time
    /// it takes from the requests already there (docs/behaviour.md §4, "Time").
    Time,
}

/// How requests are placed: together with the others of a short window, or each the moment it
/// arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Placement {
    /// Collected for windowDurationMs (sealed earlier on hints, idleSealMs or maxBatchSize) and
    /// planned jointly, longest first.
    Window,
    /// Each request placed the moment it is read, from what is in flight (zero-wait).
    OnArrival,
}

/// docs/behaviour.md §2: how requests are windowed, hashed and placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlannerConfig {
    /// Length of the collection window in milliseconds, fixed from its first request
    /// (1..=10000; 100 when unset in window mode); 0 is zero-wait: no window, each request is
    /// placed the moment it arrives, from the placements still in flight. Setting it (above 0)
    /// asks for window placement unless `placement` says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = WINDOW_DURATION_MS_MIN, max = WINDOW_DURATION_MS_MAX))]
    pub window_duration_ms: Option<i64>,
    /// k: at most this many members of one group on one replica; -1 is unlimited.
    #[serde(default = "unlimited")]
    #[schemars(range(min = UNLIMITED))]
    pub max_per_replica: i64,
    /// Tokens per prefix block (the model server's KV block size, or a multiple of it).
    #[serde(default = "default_block_size_tokens")]
    #[schemars(range(min = 1))]
    pub block_size_tokens: i64,
    /// Hash at most this many leading tokens per request; 0 uses the 2048-block cap.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_prefix_tokens_to_match: i64,
    /// N: a single request is co-located with others sharing its first N blocks; 0 co-locates
    /// identical prompts only.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_colocate_blocks: i64,
    /// Most requests one window holds; further requests are refused with `batch_full`. -1 is
    /// unlimited.
    #[serde(default = "default_max_batch_size")]
    #[schemars(range(min = UNLIMITED))]
    pub max_batch_size: i64,
    /// What load means when balancing: `requests`, `tokens` or `time`. Unset: `time` with
    /// memory (the default), in a window as on arrival, since each request then goes where it
    /// is answered first; `requests` without memory (a config without memory places exactly as
    /// llm-d does). In a window every mode gives a request that shares nothing no affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_by: Option<BalanceBy>,
    /// `window` or `onArrival`. Unset: `window` when windowDurationMs is set above 0,
    /// `onArrival` when it is 0, else the default (docs/behaviour.md §3 says which and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// What the time cost (`balanceBy: time`) assumes of requests and replicas until the engines
    /// say (their /metrics, with engines.loadIntervalMs).
    #[serde(default)]
    pub time: TimeConfig,
    /// Seal a window once no request arrived for this many milliseconds; 0 is off. At most
    /// windowDurationMs, which stays the upper bound of every wait.
    #[serde(default)]
    #[schemars(range(min = 0, max = WINDOW_DURATION_MS_MAX))]
    pub idle_seal_ms: i64,
    /// Seal a window as soon as every group whose size a client hinted (body field
    /// `burst_prefix.group_size` or header `x-burst-prefix-group-size`) is complete.
    #[serde(default = "enabled")]
    pub seal_on_hints: bool,
    /// What the planner remembers across windows: which prefixes each replica probably still
    /// caches, and how busy it was recently.
    #[serde(default)]
    pub memory: MemoryConfig,
    /// What the engines tell the producer themselves: the blocks they cache (KV events), how
    /// they tokenize, how busy they are. All off by default.
    #[serde(default)]
    pub engines: EngineConfig,
}

/// docs/behaviour.md §4, "Time": the time cost's figures until each replica's own /metrics teach
/// better ones. The defaults are Llama-3.1-8B on one H100 (BLIS's calibrated step model) and
/// vLLM's default of 256 sequences; a replica's are learned from its metrics when
/// engines.loadIntervalMs is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeConfig {
    /// The answer length expected of a request, in tokens; a request asking for fewer
    /// (`max_tokens`, `max_completion_tokens`) is priced at its own, on arrival.
    #[serde(default = "default_output_tokens")]
    #[schemars(range(min = 1))]
    pub output_tokens: i64,
    /// Nanoseconds a replica takes per prompt token it does not cache.
    #[serde(default = "default_prefill_nanos_per_token")]
    #[schemars(range(min = 0))]
    pub prefill_nanos_per_token: i64,
    /// Nanoseconds every prefill takes besides its tokens.
    #[serde(default = "default_prefill_overhead_nanos")]
    #[schemars(range(min = 0))]
    pub prefill_overhead_nanos: i64,
    /// Nanoseconds per decode step with one sequence running.
    #[serde(default = "default_decode_step_nanos")]
    #[schemars(range(min = 1))]
    pub decode_step_nanos: i64,
    /// Nanoseconds each further running sequence adds to a decode step.
    #[serde(default = "default_decode_step_nanos_per_sequence")]
    #[schemars(range(min = 0))]
    pub decode_step_nanos_per_sequence: i64,
    /// Requests a replica runs at once (vLLM's --max-num-seqs); the next ones wait for a slot.
    #[serde(default = "default_max_running")]
    #[schemars(range(min = 1))]
    pub max_running: i64,
}

fn default_output_tokens() -> i64 {
    256
}
fn default_prefill_nanos_per_token() -> i64 {
    (Speed::default().prefill_seconds_per_token * 1e9).round() as i64
}
fn default_prefill_overhead_nanos() -> i64 {
    (Speed::default().prefill_overhead_seconds * 1e9).round() as i64
}
fn default_decode_step_nanos() -> i64 {
    (Speed::default().decode_seconds_per_step * 1e9).round() as i64
}
fn default_decode_step_nanos_per_sequence() -> i64 {
    (Speed::default().decode_seconds_per_step_per_sequence * 1e9).round() as i64
}
fn default_max_running() -> i64 {
    Speed::default().max_running as i64
}

impl Default for TimeConfig {
    fn default() -> Self {
        TimeConfig {
            output_tokens: default_output_tokens(),
            prefill_nanos_per_token: default_prefill_nanos_per_token(),
            prefill_overhead_nanos: default_prefill_overhead_nanos(),
            decode_step_nanos: default_decode_step_nanos(),
            decode_step_nanos_per_sequence: default_decode_step_nanos_per_sequence(),
            max_running: default_max_running(),
        }
    }
}

impl TimeConfig {
    /// A replica's speed until its own metrics say.
    pub fn speed(&self) -> Speed {
        let seconds = |nanos: i64| nanos.max(0) as f64 * 1e-9;
        Speed {
            prefill_seconds_per_token: seconds(self.prefill_nanos_per_token),
            prefill_overhead_seconds: seconds(self.prefill_overhead_nanos),
            decode_seconds_per_step: seconds(self.decode_step_nanos),
            decode_seconds_per_step_per_sequence: seconds(self.decode_step_nanos_per_sequence),
            max_running: self.max_running.max(1) as f64,
        }
    }
}

/// docs/behaviour.md §7: what the engines say about their own caches and load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineConfig {
    /// The engines' KV-cache events (vLLM `--kv-events-config`): which prefix blocks each
    /// replica really holds, evictions and resets included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventsConfig>,
    /// The model's tokenizer, so that text and chat prompts are hashed as the engine's tokens
    /// (needed to match them against KV events; without it only token-id prompts match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerConfig>,
    /// Read each replica's load from its `/metrics` (vLLM's requests running and waiting) this
    /// often, in milliseconds; 0, the default, is off (0..=60000).
    #[serde(default)]
    #[schemars(range(min = 0, max = LOAD_INTERVAL_MS_MAX))]
    pub load_interval_ms: i64,
}

/// Where the engines' KV events come from: one of the two ways.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvEventsConfig {
    /// The producer binds this ZMQ endpoint (e.g. `tcp://0.0.0.0:5557`) and every engine
    /// connects to it, publishing with its endpoint id as the topic. Behind the producer
    /// Service each engine's connection reaches one producer pod (with several replicas, the
    /// leader when it connected): for HA, use connectPort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// Each engine binds its own publisher on this port (`tcp://*:PORT`) and the producer
    /// connects to every ready endpoint's: every producer replica hears every engine (HA).
    #[serde(default)]
    #[schemars(range(min = 0, max = 65535))]
    pub connect_port: i64,
    /// The port of each engine's replay socket (vLLM's `replay_endpoint`), asked for what a
    /// gap in sequence numbers missed; 0: no replay (a gap forgets the replica's blocks).
    #[serde(default)]
    #[schemars(range(min = 0, max = 65535))]
    pub replay_port: i64,
}

/// A model directory with `tokenizer.json`, `tokenizer_config.json` and its chat template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenizerConfig {
    /// The directory, in the producer's container (e.g. a mounted volume).
    pub path: String,
}

/// docs/behaviour.md §7: memory across windows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryConfig {
    /// Remember, per replica, the prefix blocks placed on it in earlier windows (so that a
    /// conversation's next turn or the next fan-out on a system prompt goes where that prefix
    /// is cached) and the load it got recently. false plans every window as if every cache were
    /// cold, exactly as the llm-d plugin does.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// Tokens of prefix cache each replica is assumed to keep (about its KV cache size in
    /// tokens); beyond it, the least recently used blocks are forgotten. At least
    /// blockSizeTokens; memory held by the producer grows with it times the replicas.
    #[serde(default = "default_cache_tokens_per_replica")]
    #[schemars(range(min = 1))]
    pub cache_tokens_per_replica: i64,
    /// The load a replica got in earlier windows still counts when balancing, halving every
    /// this many milliseconds (about a request's duration, when windows overlap running work).
    /// 0, the default, forgets it at once: within a window the balance rule (the fair share;
    /// with balanceBy tokens, where each unit finishes first) already keeps remembered
    /// prefixes from piling work onto one replica (0..=3600000).
    #[serde(default = "default_load_half_life_ms")]
    #[schemars(range(min = 0, max = LOAD_HALF_LIFE_MS_MAX))]
    pub load_half_life_ms: i64,
}

/// windowDurationMs when a window is asked for without a length (the seed's 100 ms).
pub const DEFAULT_WINDOW_DURATION_MS: i64 = 100;

/// How requests are placed when the config does not say (docs/behaviour.md §3).
pub const DEFAULT_PLACEMENT: Placement = Placement::OnArrival;
fn unlimited() -> i64 {
    UNLIMITED
}
fn default_block_size_tokens() -> i64 {
    64
}
fn default_max_batch_size() -> i64 {
    1000
}
fn enabled() -> bool {
    true
}
fn default_cache_tokens_per_replica() -> i64 {
    262_144
}
/// Off: in the simulator a window's work is done by the next, and the balance within a window
/// already keeps remembered prefixes from piling up (BENCHMARKS.md); carried load only made
/// the imbalance worse there. Set it about a request's duration when windows overlap running work.
fn default_load_half_life_ms() -> i64 {
    0
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            enabled: enabled(),
            cache_tokens_per_replica: default_cache_tokens_per_replica(),
            load_half_life_ms: default_load_half_life_ms(),
        }
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            window_duration_ms: None,
            max_per_replica: unlimited(),
            block_size_tokens: default_block_size_tokens(),
            max_prefix_tokens_to_match: 0,
            min_colocate_blocks: 0,
            max_batch_size: default_max_batch_size(),
            balance_by: None,
            placement: None,
            time: TimeConfig::default(),
            idle_seal_ms: 0,
            seal_on_hints: enabled(),
            memory: MemoryConfig::default(),
            engines: EngineConfig::default(),
        }
    }
}

/// One validation rule: the field it names, what it requires, the same rule in CEL (over the
/// object that holds the fields, as the CRD evaluates it), and the check itself.
pub struct Rule {
    pub field: &'static str,
    pub requirement: &'static str,
    pub cel: &'static str,
    value: fn(&PlannerConfig) -> i64,
    holds: fn(&PlannerConfig) -> bool,
}

impl Rule {
    /// The message the API server and the validation function both give.
    pub fn message(&self) -> String {
        format!("{} {}", self.field, self.requirement)
    }
}

/// Every rule of docs/behaviour.md §2. `balanceBy` is an enum, so its type is its rule.
pub const RULES: &[Rule] = &[
    Rule {
        field: "windowDurationMs",
        requirement: "must be 0 (zero-wait) or between 1 and 10000",
        cel: "!has(self.windowDurationMs) || (self.windowDurationMs >= 0 && self.windowDurationMs <= 10000)",
        value: |c| c.window_ms(),
        holds: |c| (WINDOW_DURATION_MS_MIN..=WINDOW_DURATION_MS_MAX).contains(&c.window_ms()),
    },
    Rule {
        field: "placement",
        requirement: "must not be window when windowDurationMs is 0",
        cel: "!has(self.placement) || self.placement != 'window' || !has(self.windowDurationMs) || self.windowDurationMs != 0",
        value: |c| c.window_ms(),
        holds: |c| c.placement != Some(Placement::Window) || c.window_ms() != 0,
    },
    Rule {
        field: "maxPerReplica",
        requirement: "must be -1 (unlimited) or >= 1",
        cel: "self.maxPerReplica == -1 || self.maxPerReplica >= 1",
        value: |c| c.max_per_replica,
        holds: |c| c.max_per_replica == UNLIMITED || c.max_per_replica >= 1,
    },
    Rule {
        field: "blockSizeTokens",
        requirement: "must be >= 1",
        cel: "self.blockSizeTokens >= 1",
        value: |c| c.block_size_tokens,
        holds: |c| c.block_size_tokens >= 1,
    },
    Rule {
        field: "maxPrefixTokensToMatch",
        requirement: "must be 0, or >= blockSizeTokens",
        cel: "self.maxPrefixTokensToMatch == 0 || self.maxPrefixTokensToMatch >= self.blockSizeTokens",
        value: |c| c.max_prefix_tokens_to_match,
        holds: |c| {
            c.max_prefix_tokens_to_match == 0
                || c.max_prefix_tokens_to_match >= c.block_size_tokens.max(1)
        },
    },
    Rule {
        field: "minColocateBlocks",
        requirement: "must be >= 0",
        cel: "self.minColocateBlocks >= 0",
        value: |c| c.min_colocate_blocks,
        holds: |c| c.min_colocate_blocks >= 0,
    },
    Rule {
        field: "maxBatchSize",
        requirement: "must be -1 (unlimited) or >= 1",
        cel: "self.maxBatchSize == -1 || self.maxBatchSize >= 1",
        value: |c| c.max_batch_size,
        holds: |c| c.max_batch_size == UNLIMITED || c.max_batch_size >= 1,
    },
    Rule {
        field: "idleSealMs",
        requirement: "must be 0 (off), or between 1 and windowDurationMs",
        cel: "self.idleSealMs == 0 || (self.idleSealMs >= 1 && self.idleSealMs <= (has(self.windowDurationMs) ? self.windowDurationMs : 100))",
        value: |c| c.idle_seal_ms,
        holds: |c| c.idle_seal_ms == 0 || (c.idle_seal_ms >= 1 && c.idle_seal_ms <= c.window_ms()),
    },
    Rule {
        field: "memory.cacheTokensPerReplica",
        requirement: "must be >= blockSizeTokens",
        cel: "!has(self.memory) || !has(self.memory.cacheTokensPerReplica) || self.memory.cacheTokensPerReplica >= self.blockSizeTokens",
        value: |c| c.memory.cache_tokens_per_replica,
        holds: |c| c.memory.cache_tokens_per_replica >= c.block_size_tokens.max(1),
    },
    Rule {
        field: "memory.loadHalfLifeMs",
        requirement: "must be between 0 and 3600000",
        cel: "!has(self.memory) || !has(self.memory.loadHalfLifeMs) || (self.memory.loadHalfLifeMs >= 0 && self.memory.loadHalfLifeMs <= 3600000)",
        value: |c| c.memory.load_half_life_ms,
        holds: |c| (0..=LOAD_HALF_LIFE_MS_MAX).contains(&c.memory.load_half_life_ms),
    },
    Rule {
        field: "engines.kvEvents.connectPort",
        requirement: "must be 0 (off) or a port, 1 to 65535, and 0 when kvEvents.bind is set",
        cel: "!has(self.engines) || !has(self.engines.kvEvents) || !has(self.engines.kvEvents.connectPort) || (self.engines.kvEvents.connectPort >= 0 && self.engines.kvEvents.connectPort <= 65535 && (self.engines.kvEvents.connectPort == 0 || !has(self.engines.kvEvents.bind)))",
        value: |c| c.engines.kv_events.as_ref().map_or(0, |k| k.connect_port),
        holds: |c| {
            c.engines.kv_events.as_ref().is_none_or(|k| {
                (0..=65_535).contains(&k.connect_port) && (k.connect_port == 0 || k.bind.is_none())
            })
        },
    },
    Rule {
        field: "engines.kvEvents.replayPort",
        requirement: "must be 0 (off) or a port, 1 to 65535",
        cel: "!has(self.engines) || !has(self.engines.kvEvents) || !has(self.engines.kvEvents.replayPort) || (self.engines.kvEvents.replayPort >= 0 && self.engines.kvEvents.replayPort <= 65535)",
        value: |c| c.engines.kv_events.as_ref().map_or(0, |k| k.replay_port),
        holds: |c| {
            c.engines
                .kv_events
                .as_ref()
                .is_none_or(|k| (0..=65_535).contains(&k.replay_port))
        },
    },
    Rule {
        field: "time.outputTokens",
        requirement: "must be >= 1",
        cel: "!has(self.time) || !has(self.time.outputTokens) || self.time.outputTokens >= 1",
        value: |c| c.time.output_tokens,
        holds: |c| c.time.output_tokens >= 1,
    },
    Rule {
        field: "time.prefillNanosPerToken",
        requirement: "must be >= 0",
        cel: "!has(self.time) || !has(self.time.prefillNanosPerToken) || self.time.prefillNanosPerToken >= 0",
        value: |c| c.time.prefill_nanos_per_token,
        holds: |c| c.time.prefill_nanos_per_token >= 0,
    },
    Rule {
        field: "time.prefillOverheadNanos",
        requirement: "must be >= 0",
        cel: "!has(self.time) || !has(self.time.prefillOverheadNanos) || self.time.prefillOverheadNanos >= 0",
        value: |c| c.time.prefill_overhead_nanos,
        holds: |c| c.time.prefill_overhead_nanos >= 0,
    },
    Rule {
        field: "time.decodeStepNanos",
        requirement: "must be >= 1",
        cel: "!has(self.time) || !has(self.time.decodeStepNanos) || self.time.decodeStepNanos >= 1",
        value: |c| c.time.decode_step_nanos,
        holds: |c| c.time.decode_step_nanos >= 1,
    },
    Rule {
        field: "time.decodeStepNanosPerSequence",
        requirement: "must be >= 0",
        cel: "!has(self.time) || !has(self.time.decodeStepNanosPerSequence) || self.time.decodeStepNanosPerSequence >= 0",
        value: |c| c.time.decode_step_nanos_per_sequence,
        holds: |c| c.time.decode_step_nanos_per_sequence >= 0,
    },
    Rule {
        field: "time.maxRunning",
        requirement: "must be >= 1",
        cel: "!has(self.time) || !has(self.time.maxRunning) || self.time.maxRunning >= 1",
        value: |c| c.time.max_running,
        holds: |c| c.time.max_running >= 1,
    },
    Rule {
        field: "engines.loadIntervalMs",
        requirement: "must be between 0 (off) and 60000",
        cel: "!has(self.engines) || !has(self.engines.loadIntervalMs) || (self.engines.loadIntervalMs >= 0 && self.engines.loadIntervalMs <= 60000)",
        value: |c| c.engines.load_interval_ms,
        holds: |c| (0..=LOAD_INTERVAL_MS_MAX).contains(&c.engines.load_interval_ms),
    },
];

/// A broken rule: the field, its value and the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: &'static str,
    pub value: String,
    pub requirement: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is {}, but {}",
            self.field, self.value, self.requirement
        )
    }
}

/// Every rule a config breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigError(pub Vec<Violation>);

impl PlannerConfig {
    /// The one validation function (docs/behaviour.md §2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let violations: Vec<Violation> = RULES
            .iter()
            .filter(|rule| !(rule.holds)(self))
            .map(|rule| Violation {
                field: rule.field,
                value: (rule.value)(self).to_string(),
                requirement: rule.requirement,
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(violations))
        }
    }

    /// What load means: `balanceBy`, else time with memory and requests without (llm-d's).
    pub fn balance(&self) -> BalanceBy {
        self.balance_with_memory(self.memory.enabled)
    }

    fn balance_with_memory(&self, memory: bool) -> BalanceBy {
        self.balance_by.unwrap_or(match memory {
            true => BalanceBy::Time,
            false => BalanceBy::Requests,
        })
    }

    /// How requests are placed: `placement`; else a window when windowDurationMs asks for one
    /// (above 0), on arrival when it is 0, [`DEFAULT_PLACEMENT`] when it is unset.
    pub fn placement(&self) -> Placement {
        self.placement.unwrap_or(match self.window_duration_ms {
            Some(0) => Placement::OnArrival,
            Some(_) => Placement::Window,
            None => DEFAULT_PLACEMENT,
        })
    }

    /// The window's length in window mode: windowDurationMs, else the seed's 100 ms.
    pub fn window_ms(&self) -> i64 {
        self.window_duration_ms
            .unwrap_or(DEFAULT_WINDOW_DURATION_MS)
    }

    /// The planner's view of a validated config.
    pub fn plan_params(&self) -> PlanParams {
        self.plan_params_with_memory(self.memory.enabled)
    }

    /// The planner's view of a batch planned alone (`/v1/plan`: no memory, so by default
    /// balanced as llm-d's, docs/behaviour.md §4 exactly).
    pub fn plan_params_alone(&self) -> PlanParams {
        self.plan_params_with_memory(false)
    }

    fn plan_params_with_memory(&self, memory: bool) -> PlanParams {
        PlanParams {
            max_per_replica: usize::try_from(self.max_per_replica)
                .ok()
                .filter(|&k| k >= 1),
            min_colocate_blocks: usize::try_from(self.min_colocate_blocks).unwrap_or(0),
            balance_by: match self.balance_with_memory(memory) {
                BalanceBy::Requests => burst_prefix_planner::BalanceBy::Requests,
                BalanceBy::Tokens => burst_prefix_planner::BalanceBy::Tokens,
                BalanceBy::Time => burst_prefix_planner::BalanceBy::Time,
            },
            block_tokens: u32::try_from(self.block_size_tokens)
                .unwrap_or(u32::MAX)
                .max(1),
            output_tokens: u32::try_from(self.time.output_tokens)
                .unwrap_or(u32::MAX)
                .max(1),
            // A process setting, not the config's (`serve --active-active`).
            agree_with_peers: false,
        }
    }

    /// How prompts are cut into blocks under a validated config.
    pub fn block_spec(&self) -> BlockSpec {
        BlockSpec::new(
            usize::try_from(self.block_size_tokens).unwrap_or(1).max(1),
            usize::try_from(self.max_prefix_tokens_to_match).unwrap_or(0),
        )
    }

    /// The idle seal of a validated config, `None` when off.
    pub fn idle_seal(&self) -> Option<std::time::Duration> {
        u64::try_from(self.idle_seal_ms)
            .ok()
            .filter(|&ms| ms >= 1)
            .map(std::time::Duration::from_millis)
    }

    /// The memory of a validated config, `None` when disabled (docs/behaviour.md §4 exactly).
    pub fn memory_settings(&self) -> Option<MemorySettings> {
        let memory = &self.memory;
        if !memory.enabled {
            return None;
        }
        let block = self.block_size_tokens.max(1);
        let blocks = usize::try_from(memory.cache_tokens_per_replica / block).unwrap_or(1);
        Some(MemorySettings {
            capacity_blocks: NonZeroUsize::new(blocks).unwrap_or(NonZeroUsize::MIN),
            load_half_life_ms: u64::try_from(memory.load_half_life_ms).unwrap_or(0),
        })
    }

    /// The window's capacity, `None` when unlimited.
    pub fn max_batch_size(&self) -> Option<usize> {
        usize::try_from(self.max_batch_size)
            .ok()
            .filter(|&n| n >= 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec_and_are_valid() {
        let config: PlannerConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, PlannerConfig::default());
        assert_eq!((config.window_duration_ms, config.window_ms()), (None, 100));
        assert_eq!(config.max_per_replica, -1);
        assert_eq!(config.block_size_tokens, 64);
        assert_eq!(config.max_prefix_tokens_to_match, 0);
        assert_eq!(config.min_colocate_blocks, 0);
        assert_eq!(config.max_batch_size, 1000);
        assert_eq!(config.balance_by, None);
        assert_eq!(config.balance(), BalanceBy::Time, "time with memory");
        assert_eq!(config.placement, None);
        assert_eq!(config.placement(), DEFAULT_PLACEMENT);
        assert_eq!(config.time, TimeConfig::default());
        // The config's nanoseconds are the planner's default speed, to the nanosecond.
        let (config_speed, default) = (config.time.speed(), burst_prefix_planner::Speed::default());
        for (a, b) in [
            (
                config_speed.prefill_seconds_per_token,
                default.prefill_seconds_per_token,
            ),
            (
                config_speed.prefill_overhead_seconds,
                default.prefill_overhead_seconds,
            ),
            (
                config_speed.decode_seconds_per_step,
                default.decode_seconds_per_step,
            ),
            (
                config_speed.decode_seconds_per_step_per_sequence,
                default.decode_seconds_per_step_per_sequence,
            ),
            (config_speed.max_running, default.max_running),
        ] {
            assert!((a - b).abs() < 1e-9, "{config_speed:?} vs {default:?}");
        }
        assert_eq!((config.idle_seal_ms, config.seal_on_hints), (0, true));
        assert_eq!(config.idle_seal(), None);
        assert_eq!(
            config.memory,
            MemoryConfig {
                enabled: true,
                cache_tokens_per_replica: 262_144,
                load_half_life_ms: 0
            }
        );
        let settings = config.memory_settings().unwrap();
        assert_eq!(settings.capacity_blocks.get(), 4096);
        assert_eq!(settings.load_half_life_ms, 0);
        config.validate().unwrap();
    }

    #[test]
    fn memory_can_be_disabled_and_its_rules_name_their_fields() {
        let config: PlannerConfig =
            serde_json::from_str(r#"{"memory": {"enabled": false}}"#).unwrap();
        assert_eq!(config.memory_settings(), None);
        assert_eq!(config.memory.cache_tokens_per_replica, 262_144);
        assert_eq!(
            invalid(|c| c.memory.cache_tokens_per_replica = 63),
            ["memory.cacheTokensPerReplica"]
        );
        assert_eq!(
            invalid(|c| c.memory.load_half_life_ms = -1),
            ["memory.loadHalfLifeMs"]
        );
        assert_eq!(
            invalid(|c| c.memory.load_half_life_ms = LOAD_HALF_LIFE_MS_MAX + 1),
            ["memory.loadHalfLifeMs"]
        );
        let err = serde_json::from_str::<PlannerConfig>(r#"{"memory": {"size": 1}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `size`"), "{err}");
    }

    fn invalid(edit: impl Fn(&mut PlannerConfig)) -> Vec<&'static str> {
        let mut config = PlannerConfig::default();
        edit(&mut config);
        config
            .validate()
            .unwrap_err()
            .0
            .iter()
            .map(|v| v.field)
            .collect()
    }

    #[test]
    fn every_rule_rejects_its_field() {
        assert_eq!(
            invalid(|c| c.window_duration_ms = Some(-1)),
            ["windowDurationMs"]
        );
        assert_eq!(
            invalid(|c| c.window_duration_ms = Some(10_001)),
            ["windowDurationMs"]
        );
        assert_eq!(invalid(|c| c.max_per_replica = 0), ["maxPerReplica"]);
        assert_eq!(invalid(|c| c.max_per_replica = -2), ["maxPerReplica"]);
        assert_eq!(invalid(|c| c.block_size_tokens = 0), ["blockSizeTokens"]);
        assert_eq!(
            invalid(|c| c.max_prefix_tokens_to_match = 63),
            ["maxPrefixTokensToMatch"]
        );
        assert_eq!(
            invalid(|c| c.max_prefix_tokens_to_match = -1),
            ["maxPrefixTokensToMatch"]
        );
        assert_eq!(
            invalid(|c| c.min_colocate_blocks = -1),
            ["minColocateBlocks"]
        );
        assert_eq!(invalid(|c| c.max_batch_size = 0), ["maxBatchSize"]);
        assert_eq!(invalid(|c| c.idle_seal_ms = -1), ["idleSealMs"]);
        assert_eq!(invalid(|c| c.idle_seal_ms = 101), ["idleSealMs"]);
        assert_eq!(
            invalid(|c| {
                c.window_duration_ms = Some(-1);
                c.max_batch_size = -5;
            }),
            ["windowDurationMs", "maxBatchSize"]
        );
    }

    #[test]
    fn kv_events_take_one_topology_and_ports_in_range() {
        let with = |bind: Option<&str>, connect_port, replay_port| {
            let config = PlannerConfig {
                engines: EngineConfig {
                    kv_events: Some(KvEventsConfig {
                        bind: bind.map(str::to_string),
                        connect_port,
                        replay_port,
                    }),
                    ..EngineConfig::default()
                },
                ..PlannerConfig::default()
            };
            config
                .validate()
                .err()
                .map(|e| e.0.iter().map(|v| v.field).collect::<Vec<_>>())
        };
        assert_eq!(with(Some("tcp://0.0.0.0:5557"), 0, 0), None);
        assert_eq!(with(None, 5557, 5558), None);
        assert_eq!(
            with(Some("tcp://0.0.0.0:5557"), 5557, 0),
            Some(vec!["engines.kvEvents.connectPort"])
        );
        assert_eq!(
            with(None, 70_000, -1),
            Some(vec![
                "engines.kvEvents.connectPort",
                "engines.kvEvents.replayPort"
            ])
        );
    }

    #[test]
    fn boundaries_are_valid() {
        let config = PlannerConfig {
            window_duration_ms: Some(10_000),
            max_per_replica: 1,
            block_size_tokens: 1,
            max_prefix_tokens_to_match: 1,
            min_colocate_blocks: 0,
            max_batch_size: -1,
            balance_by: Some(BalanceBy::Tokens),
            placement: Some(Placement::Window),
            time: TimeConfig {
                output_tokens: 1,
                prefill_nanos_per_token: 0,
                prefill_overhead_nanos: 0,
                decode_step_nanos: 1,
                decode_step_nanos_per_sequence: 0,
                max_running: 1,
            },
            idle_seal_ms: 10_000,
            seal_on_hints: false,
            memory: MemoryConfig {
                enabled: true,
                cache_tokens_per_replica: 1,
                load_half_life_ms: 0,
            },
            engines: EngineConfig {
                kv_events: Some(KvEventsConfig {
                    bind: None,
                    connect_port: 65_535,
                    replay_port: 65_535,
                }),
                tokenizer: None,
                load_interval_ms: 60_000,
            },
        };
        config.validate().unwrap();
        assert_eq!(config.max_batch_size(), None);
        assert_eq!(config.plan_params().max_per_replica, Some(1));
        assert_eq!(config.block_spec().max_blocks, 1);
    }

    #[test]
    fn a_zero_window_is_zero_wait_and_valid_without_an_idle_seal() {
        let zero_wait = PlannerConfig {
            window_duration_ms: Some(0),
            ..PlannerConfig::default()
        };
        zero_wait.validate().unwrap();
        assert_eq!(
            invalid(|c| {
                c.window_duration_ms = Some(0);
                c.idle_seal_ms = 1;
            }),
            ["idleSealMs"]
        );
    }

    #[test]
    fn violation_names_field_value_and_rule() {
        let config = PlannerConfig {
            max_prefix_tokens_to_match: 10,
            ..PlannerConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "maxPrefixTokensToMatch is 10, but must be 0, or >= blockSizeTokens"
        );
    }

    #[test]
    fn unknown_fields_and_bad_enums_are_refused_by_name() {
        let err = serde_json::from_str::<PlannerConfig>(r#"{"windowMs": 5}"#).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `windowMs`"),
            "{err}"
        );
        let err = serde_json::from_str::<PlannerConfig>(r#"{"balanceBy": "bytes"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `bytes`"), "{err}");
    }

    #[test]
    fn plan_params_follow_the_config() {
        let config = PlannerConfig {
            max_per_replica: -1,
            min_colocate_blocks: 4,
            balance_by: Some(BalanceBy::Tokens),
            ..PlannerConfig::default()
        };
        let params = config.plan_params();
        assert_eq!(params.max_per_replica, None);
        assert_eq!(params.min_colocate_blocks, 4);
        assert_eq!(params.balance_by, burst_prefix_planner::BalanceBy::Tokens);
        assert_eq!(config.block_spec(), BlockSpec::new(64, 0));
    }
}
