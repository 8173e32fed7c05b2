//! What a request gets when its window is planned: the replica it was placed on, what the
//! memory said each endpoint held of it, and the window it was planned in.

use std::sync::Arc;
use std::time::Duration;

use burst_prefix_planner::{HeldPrefixes, PlacementId};

use super::config_store::Snapshot;
use super::window::seal::SealReason;

/// What a request gets when its window is planned.
#[derive(Clone, Debug)]
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
    /// Placed on arrival (zero-wait mode): its handle in the work in flight.
    pub arrival: Option<PlacementId>,
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
