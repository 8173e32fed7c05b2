//! A second, naive reading of docs/behaviour.md §4 (placement without memory), written from the
//! spec's text and not from `src/plan.rs`: plain loops over every replica, a set of held blocks per
//! replica, and no index. The parity tests check `assign` against it; the benches use it as the
//! baseline.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use burst_prefix_planner::{BalanceBy, BatchRequest, BlockHash, PlanParams, Replica};

/// What the reference decides for one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferencePlan {
    pub assignments: Vec<Option<usize>>,
    pub loads: Vec<u64>,
    pub group_units: usize,
    pub single_units: usize,
}

struct Unit<'a> {
    blocks: &'a [BlockHash],
    members: Vec<usize>,
    is_group: bool,
}

pub fn reference_assign(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
) -> ReferencePlan {
    let n = params.min_colocate_blocks;
    let k = params.max_per_replica.unwrap_or(usize::MAX);

    // Step 1: requests with equal full block sequences form a group; no blocks, no group.
    let mut groups: Vec<Unit<'_>> = Vec::new();
    let mut group_of: HashMap<&[BlockHash], usize> = HashMap::new();
    for (i, request) in batch.iter().enumerate() {
        if request.blocks.is_empty() {
            continue;
        }
        let g = *group_of.entry(request.blocks).or_insert_with(|| {
            groups.push(Unit {
                blocks: request.blocks,
                members: Vec::new(),
                is_group: false,
            });
            groups.len() - 1
        });
        groups[g].members.push(i);
    }

    // Step 2: a group of 2+ is a unit; a single is one iff another request shares its first N.
    let mut first_n_count: HashMap<&[BlockHash], usize> = HashMap::new();
    if n > 0 {
        for request in batch.iter().filter(|r| r.blocks.len() >= n) {
            *first_n_count.entry(&request.blocks[..n]).or_default() += 1;
        }
    }
    let mut units: Vec<Unit<'_>> = Vec::new();
    for mut group in groups {
        if group.members.len() >= 2 {
            group.is_group = true;
            units.push(group);
        } else if n > 0 && group.blocks.len() >= n && first_n_count[&group.blocks[..n]] >= 2 {
            units.push(group);
        }
    }

    // Step 3: groups, then singles; more blocks first; ties in arrival order (stable sort).
    units.sort_by_key(|u| (!u.is_group, Reverse(u.blocks.len())));

    let group_units = units.iter().filter(|u| u.is_group).count();
    let mut plan = ReferencePlan {
        assignments: vec![None; batch.len()],
        loads: vec![0; replicas.len()],
        group_units,
        single_units: units.len() - group_units,
    };
    if replicas.is_empty() {
        return plan;
    }

    // Step 4: the fair share.
    let total: usize = units
        .iter()
        .map(|u| match params.balance_by {
            BalanceBy::Requests => u.members.len(),
            BalanceBy::Tokens => u.blocks.len(),
            BalanceBy::Time => unreachable!("llm-d has no time mode"),
        })
        .sum();
    let max_share = total.div_ceil(replicas.len()) as u64;

    // Step 5.
    let mut held: Vec<HashSet<BlockHash>> = vec![HashSet::new(); replicas.len()];
    let load = &mut plan.loads;
    for unit in &units {
        let matches: Vec<usize> = held
            .iter()
            .map(|h| unit.blocks.iter().take_while(|b| h.contains(b)).count())
            .collect();
        let mut here = vec![0usize; replicas.len()];
        let mut touched: Vec<usize> = Vec::new();

        // Step 6: lower window load, then fewer running requests, then the lower id.
        let key = |load: &[u64], r: usize| {
            (
                load[r],
                replicas[r].running_requests,
                replicas[r].id.as_bytes(),
            )
        };
        let least_loaded = |load: &[u64], here: &[usize], only_under_k: bool| {
            (0..replicas.len())
                .filter(|&r| !only_under_k || here[r] < k)
                .min_by(|&a, &b| key(load, a).cmp(&key(load, b)))
        };

        let mut first = None;
        if n > 0 {
            for r in 0..replicas.len() {
                if matches[r] >= n && load[r] < max_share && here[r] < k {
                    let better = match first {
                        None => true,
                        Some(best) => {
                            matches[r] > matches[best]
                                || (matches[r] == matches[best] && key(load, r) < key(load, best))
                        }
                    };
                    if better {
                        first = Some(r);
                    }
                }
            }
        }
        let first = first
            .or_else(|| least_loaded(load, &here, true))
            .or_else(|| least_loaded(load, &here, false))
            .unwrap();

        let mut put = |member: usize, r: usize, load: &mut Vec<u64>, here: &mut Vec<usize>| {
            if here[r] == 0 {
                touched.push(r);
                if params.balance_by == BalanceBy::Tokens {
                    load[r] += (unit.blocks.len() - matches[r]) as u64;
                }
            }
            if params.balance_by == BalanceBy::Requests {
                load[r] += 1;
            }
            here[r] += 1;
            plan.assignments[member] = Some(r);
        };

        let mut rest: &[usize] = &unit.members;
        let mut target = Some(first);
        while let Some(r) = target {
            let take = k.min(rest.len());
            for &member in &rest[..take] {
                put(member, r, load, &mut here);
            }
            rest = &rest[take..];
            if rest.is_empty() {
                break;
            }
            target = least_loaded(load, &here, true);
        }
        for &member in rest {
            let r = least_loaded(load, &here, false).unwrap();
            put(member, r, load, &mut here);
        }
        for r in touched {
            held[r].extend(unit.blocks.iter().copied());
        }
    }

    // Step 7: an assigned replica outside the request's own list means no affinity.
    for (assigned, request) in plan.assignments.iter_mut().zip(batch) {
        if let (Some(r), Some(allowed)) = (*assigned, request.allowed_replicas) {
            if !allowed.contains(&r) {
                *assigned = None;
            }
        }
    }
    plan
}
