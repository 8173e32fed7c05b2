//! The JSON lines between BLIS's `burst-prefix` routing policy (bench/blis/routing_burst_prefix.go)
//! and the placer: one [`Ask`] per routed request, one [`Answer`] back; the placer's [`Hello`]
//! first. Times are BLIS's simulated microseconds.

use serde::{Deserialize, Serialize};

/// The placer's first line: what it wants to hear besides the requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    /// Send the instances' load at most this often (simulated us); 0: never (the route's
    /// `engines.loadIntervalMs`).
    pub load_interval_us: u64,
}

/// One request to route, with what a producer would have seen since the last one.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ask {
    /// Now, in simulated us.
    pub clock: u64,
    /// The instances, in BLIS's order: on the first ask only.
    #[serde(default)]
    pub instances: Option<Vec<String>>,
    /// First and last tokens of requests routed earlier, as a proxy reading their streams saw
    /// them (each at or before `clock`).
    #[serde(default)]
    pub events: Vec<Event>,
    /// The instances' load as their `/metrics` would say it now, when due (see [`Hello`]).
    #[serde(default)]
    pub load: Vec<Load>,
    /// The request's id (BLIS's).
    pub id: String,
    /// Its prompt's token ids.
    pub tokens: Vec<u32>,
}

/// What a proxy saw of an earlier request's answer.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Event {
    pub id: String,
    /// Simulated us.
    pub at: u64,
    pub kind: EventKind,
    /// The answer's tokens (on `done`).
    #[serde(default)]
    pub tokens: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Its first token.
    First,
    /// Its last.
    Done,
}

/// One instance's load: requests running and waiting.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Load {
    pub id: String,
    pub requests: u64,
}

/// Where the request goes, or why the placer cannot say (which stops the run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}
