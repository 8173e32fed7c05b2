//! Stage 3 of the path, **place** (docs/architecture.md): one [`Placer`] trait, two placers that
//! each own their state, and one function, [`place`], that builds every [`Placement`] and counts
//! every placed request's outcome.
//!
//! - [`window`]: requests that arrive close together are planned together (docs/behaviour.md
//!   §3-§4); [`seal`] says when a window need not wait for its timer.
//! - [`on_arrival`]: zero-wait mode, each request placed the moment it is read (§3).
//! - [`memory`]: what both remember of earlier placements (§7), behind one lock, so that windows
//!   and arrivals are placed one at a time.
//! - [`batch`]: a batch of hashed requests onto the planner, for windows and whole batches.
//!
//! The planner (`crates/planner`) decides; what a placer feeds it is what the producer knows of
//! each replica (its endpoints usable now, their running requests, the memory). A new placement
//! rule goes in the planner; what it needs to know of a replica comes through here.

pub mod batch;
pub mod memory;
pub mod on_arrival;
pub mod seal;
pub mod window;

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use burst_prefix_planner::HeldPrefixes;

use crate::budget::Reserved;
use crate::config_store::Snapshot;
use crate::error::PlaceError;
use crate::metrics::{Metrics, Outcome};
use crate::read::HashedRequest;

/// Places one request at a time: the window (many at once, when sealed) or on arrival.
pub trait Placer {
    /// Places `request`, or says why not: a refusal, or that it was hashed under another config
    /// than the one this placer places it with now ([`NotPlaced::Stale`]: hash it again).
    fn place(&self, request: ToPlace) -> impl Future<Output = Result<Decision, NotPlaced>> + Send;
}

/// A request read and hashed, on its way to a placer.
#[derive(Debug)]
pub struct ToPlace {
    pub request: HashedRequest,
    /// The config it was hashed under.
    pub snapshot: Arc<Snapshot>,
    pub group_size: Option<NonZeroU32>,
    /// What its front-end keeps for it while it waits (a proxy, its body), in the byte budget;
    /// given back once it is answered.
    pub held: Reserved,
}

/// What a placer decided for one request.
#[derive(Debug)]
pub struct Decision {
    /// The request, given back.
    pub request: HashedRequest,
    /// Index into `snapshot.config.endpoints`, or `None` for no affinity.
    pub assigned: Option<usize>,
    /// The config it was placed with.
    pub snapshot: Arc<Snapshot>,
    pub window_id: u64,
    pub window_size: usize,
    pub sealed_by: SealReason,
    /// From joining to being released.
    pub waited: Duration,
    pub memory: Option<RequestHeld>,
    /// Placed on arrival: what takes it off the work in flight.
    pub finish: Option<Completion>,
}

/// Why a placer did not place a request.
#[derive(Debug)]
pub enum NotPlaced {
    Refused(PlaceError),
    /// Hashed under another config than `newer`, the one it is placed with now; `held` comes
    /// back to place it again.
    Stale {
        newer: Arc<Snapshot>,
        held: Reserved,
    },
}

impl From<PlaceError> for NotPlaced {
    fn from(error: PlaceError) -> Self {
        NotPlaced::Refused(error)
    }
}

/// A front-end's bound on a whole request (the scoring API's 30 s), past which it is refused
/// (`request_timeout`) wherever it is on the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBound {
    pub deadline: tokio::time::Instant,
    pub limit: Duration,
}

impl RequestBound {
    pub fn error(&self) -> PlaceError {
        PlaceError::RequestTimeout {
            seconds: self.limit.as_secs(),
        }
    }
}

/// Places `request` with `placer` and builds its [`Placement`]; counts it `assigned` or
/// `no_affinity` once placed, `cancelled` when its caller drops this future first (the client
/// went away: a request in an open window leaves it). A refusal is counted by the caller, which
/// turns it into a `Refused`.
pub async fn place<P: Placer>(
    placer: &P,
    metrics: &Metrics,
    request: ToPlace,
    bound: Option<RequestBound>,
) -> Result<Placement, NotPlaced> {
    let mut unanswered = CancelledUnlessAnswered(Some(metrics));
    let decided = match bound {
        Some(bound) => tokio::time::timeout_at(bound.deadline, placer.place(request))
            .await
            .unwrap_or_else(|_| Err(NotPlaced::Refused(bound.error()))),
        None => placer.place(request).await,
    };
    unanswered.0 = None;
    let decision = decided?;
    metrics.request(match decision.assigned {
        Some(_) => Outcome::Assigned,
        None => Outcome::NoAffinity,
    });
    metrics
        .request_wait_seconds
        .observe(decision.waited.as_secs_f64());
    let blocks = decision.request.blocks;
    Ok(Placement {
        assigned: decision.assigned,
        total_blocks: blocks.len(),
        group: blocks.last().copied().unwrap_or(0),
        endpoints: decision.request.endpoints,
        window_id: decision.window_id,
        window_size: decision.window_size,
        waited: decision.waited,
        sealed_by: decision.sealed_by,
        snapshot: decision.snapshot,
        memory: decision.memory,
        finish: decision.finish,
    })
}

/// Counts a request `cancelled` when dropped before its placer answered.
struct CancelledUnlessAnswered<'a>(Option<&'a Metrics>);

impl Drop for CancelledUnlessAnswered<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.0 {
            metrics.request(Outcome::Cancelled);
        }
    }
}

/// What a request gets when it is placed: the replica, what the memory said each endpoint held
/// of it, and the window it was planned in.
#[derive(Debug)]
pub struct Placement {
    /// Index into `snapshot.config.endpoints`, or `None` for no affinity.
    pub assigned: Option<usize>,
    pub total_blocks: usize,
    /// Its group of identical prompts (the last block hash; 0 without blocks): members of one
    /// group fail over to the same replica.
    pub group: u64,
    /// The endpoint ids the request may use; `None`: all.
    pub endpoints: Option<Vec<String>>,
    pub window_id: u64,
    /// Requests planned in the window (cancelled ones excluded).
    pub window_size: usize,
    /// From joining the window to being released.
    pub waited: Duration,
    /// Why the window was sealed.
    pub sealed_by: SealReason,
    /// The config the window was planned with.
    pub snapshot: Arc<Snapshot>,
    /// With memory (docs/behaviour.md §7): what each endpoint held of the request when it was
    /// placed.
    pub memory: Option<RequestHeld>,
    /// Placed on arrival (zero-wait mode): what takes it off the work in flight, called by the
    /// route's handle when the answer ends (a request nobody routes counts with a half-life).
    pub finish: Option<Completion>,
}

/// What finishes a request's placement once its answer has ended: called once, by the route's
/// handle (a placement on arrival leaves the work in flight), with the answer's length in
/// tokens when its front-end saw it.
pub struct Completion(Box<dyn FnOnce(Option<u32>) + Send + Sync>);

impl Completion {
    pub fn new(finish: impl FnOnce(Option<u32>) + Send + Sync + 'static) -> Self {
        Completion(Box::new(finish))
    }

    pub fn finish(self, answer_tokens: Option<u32>) {
        (self.0)(answer_tokens)
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Completion")
    }
}

impl Placement {
    /// `matchBlocks` for endpoint `endpoint` (a config index), docs/behaviour.md §5: every block on
    /// the assigned replica; elsewhere, with memory, the leading blocks the endpoint held; else 0.
    pub fn match_blocks(&self, endpoint: usize) -> usize {
        if self.assigned == Some(endpoint) {
            self.total_blocks
        } else {
            self.memory.as_ref().map_or(0, |held| held.blocks(endpoint))
        }
    }
}

/// Why a window was sealed (`burst_prefix_windows_sealed_total{reason}`), or `Arrival`: placed
/// without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealReason {
    /// `windowDurationMs` passed.
    Timer,
    /// Every group whose size a client hinted was complete.
    Hints,
    /// No request arrived for `idleSealMs`.
    Idle,
    /// It held `maxBatchSize` requests.
    Full,
    /// The producer was shutting down.
    Shutdown,
    /// No window: placed on arrival (zero-wait mode).
    Arrival,
}

impl SealReason {
    /// Every reason a window is sealed for.
    pub const WINDOWS: [SealReason; 5] = [
        SealReason::Timer,
        SealReason::Hints,
        SealReason::Idle,
        SealReason::Full,
        SealReason::Shutdown,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SealReason::Timer => "timer",
            SealReason::Hints => "hints",
            SealReason::Idle => "idle",
            SealReason::Full => "full",
            SealReason::Shutdown => "shutdown",
            SealReason::Arrival => "arrival",
        }
    }
}

/// What the planner's memory said of one window's requests, in the config's endpoint indices:
/// shared by the window's placements.
#[derive(Debug)]
pub struct WindowHeld {
    held: HeldPrefixes,
    /// The config index of each planned replica (ascending).
    usable: Vec<usize>,
}

impl WindowHeld {
    pub fn new(held: HeldPrefixes, usable: Vec<usize>) -> Option<Arc<Self>> {
        (!held.lists().is_empty()).then(|| Arc::new(WindowHeld { held, usable }))
    }

    /// Leading blocks of request `request` that endpoint `endpoint` (a config index) held.
    pub fn blocks(&self, request: usize, endpoint: usize) -> usize {
        self.usable
            .binary_search(&endpoint)
            .map_or(0, |replica| self.held.blocks(request, replica))
    }
}

/// What the memory (and the work in flight) said each endpoint held of one request.
#[derive(Clone, Debug)]
pub enum RequestHeld {
    /// Planned in a window: its list in the window's (see [`WindowHeld`]).
    InWindow {
        window: Arc<WindowHeld>,
        request: usize,
    },
    /// Placed on arrival: `(endpoint, leading blocks)`, sorted by endpoint.
    OnArrival(Vec<(usize, usize)>),
}

impl RequestHeld {
    pub fn new(window: &Option<Arc<WindowHeld>>, request: usize) -> Option<Self> {
        window.as_ref().map(|window| RequestHeld::InWindow {
            window: window.clone(),
            request,
        })
    }

    /// Leading blocks of the request that endpoint `endpoint` (a config index) held.
    pub fn blocks(&self, endpoint: usize) -> usize {
        match self {
            RequestHeld::InWindow { window, request } => window.blocks(*request, endpoint),
            RequestHeld::OnArrival(held) => held
                .binary_search_by_key(&endpoint, |&(e, _)| e)
                .map_or(0, |i| held[i].1),
        }
    }
}
