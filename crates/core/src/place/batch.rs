//! A batch of hashed requests, planned and mapped back to endpoint ids: windows (through
//! [`super::memory::CacheModels::plan`]) and whole batches ([`crate::whole_batch`]) both plan
//! through [`plan_batch`].

use std::collections::HashMap;

use burst_prefix_planner::{
    assign, assign_with_memory, BatchRequest, Memory, Plan, PlanParams, Replica,
};

use crate::read::HashedRequest;

/// Plans one batch: endpoint ids in the requests' lists are mapped to replica indices (unknown
/// ids are ignored), then the planner decides, with `memory` (and the time in ms on its clock)
/// when given.
pub fn plan_batch(
    params: &PlanParams,
    replicas: &[Replica<'_>],
    requests: &[HashedRequest],
    memory: Option<(&mut Memory, u64)>,
) -> Plan {
    let index: HashMap<&str, usize> = replicas
        .iter()
        .enumerate()
        .map(|(i, replica)| (replica.id, i))
        .collect();
    let allowed: Vec<Option<Vec<usize>>> = requests
        .iter()
        .map(|request| {
            request.endpoints.as_ref().map(|ids| {
                ids.iter()
                    .filter_map(|id| index.get(id.as_str()).copied())
                    .collect()
            })
        })
        .collect();
    let batch: Vec<BatchRequest<'_>> = requests
        .iter()
        .zip(&allowed)
        .map(|(request, allowed)| BatchRequest {
            blocks: &request.blocks,
            allowed_replicas: allowed.as_deref(),
        })
        .collect();
    match memory {
        Some((memory, now_ms)) => assign_with_memory(&batch, replicas, params, memory, now_ms),
        None => assign(&batch, replicas, params),
    }
}
