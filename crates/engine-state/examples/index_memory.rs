//! Measures the engine index's memory per block held and the time of a lookup:
//! `cargo run --release -p burst-prefix-engine-state --example index_memory -- [REPLICAS] [BLOCKS_PER_REPLICA]`
//! (defaults 100 and 10,000). Each replica holds its own prompts of 64 blocks of 16 tokens, plus a
//! shared 8-block system prompt; the resident set size is read from /proc/self/statm (Linux).

use std::time::Instant;

use burst_prefix_engine_state::decode::{Batch, BlockHash, BlockStored, Event};
use burst_prefix_engine_state::{EngineIndex, IndexConfig};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn stored(tokens: &[u32], hashes: Vec<u64>) -> Event {
    Event::BlockStored(BlockStored {
        block_hashes: hashes.into_iter().map(BlockHash::Int).collect(),
        parent_block_hash: None,
        token_ids: tokens.to_vec(),
        block_size: 16,
        lora_name: None,
        medium: None,
        has_extra_keys: false,
        group_idx: None,
    })
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let replicas = args.first().copied().unwrap_or(100);
    let per_replica = args.get(1).copied().unwrap_or(10_000);
    let system: Vec<u32> = (0..8 * 16).collect();
    let before = rss_bytes();
    let mut index = EngineIndex::new(IndexConfig {
        capacity_per_replica: per_replica + 64,
    });
    let mut hash = 0u64;
    let started = Instant::now();
    for r in 0..replicas {
        let id = format!("replica-{r}");
        let mut held = 0;
        let mut prompt = 0u32;
        while held < per_replica {
            let mut tokens = system.clone();
            tokens.extend(
                (0..56 * 16).map(|i| 1_000_000 + (r as u32) * 100_000 + prompt * 1000 + i % 1000),
            );
            let hashes = (0..64)
                .map(|_| {
                    hash += 1;
                    hash
                })
                .collect();
            index.apply(
                &id,
                &Batch {
                    events: vec![stored(&tokens, hashes)],
                    ..Batch::default()
                },
            );
            held += 64;
            prompt += 1;
        }
    }
    let built = started.elapsed();
    let blocks: usize = (0..replicas)
        .map(|r| index.blocks_held(&format!("replica-{r}")))
        .sum();
    let grown = rss_bytes().saturating_sub(before);
    let mut query = system.clone();
    query.extend(0..56 * 16);
    let runs = 1000;
    let started = Instant::now();
    let mut found = 0;
    for _ in 0..runs {
        found += index.held(&query).len();
    }
    let per_lookup = started.elapsed() / runs;
    println!(
        "{replicas} replicas, {blocks} blocks held: {:.1} MB resident growth, {:.0} bytes/block; built in {built:?}; \
         a 64-block lookup whose first 8 blocks all {replicas} hold: {per_lookup:?} ({} answers)",
        grown as f64 / 1e6,
        grown as f64 / blocks as f64,
        found / runs as usize
    );
}
