use burst_prefix_planner::*;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::Instant;
const PROMPT_TOKENS: usize = 4096;
const GROUP_SIZE: usize = 8;
const FAMILY_SIZE: usize = 4;
/// A deterministic pseudo-random token stream (splitmix64), so the bench needs no RNG crate.
fn tokens(seed: u64, count: usize) -> Vec<u32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 128_000) as u32
        })
        .collect()
}

/// The same shape; another `seed` gives other prompts on the same families' shared blocks.
fn window_seeded(requests: usize, seed: u64) -> Vec<Vec<BlockHash>> {
    let spec = BlockSpec::new(64, 0);
    let groups = requests.div_ceil(GROUP_SIZE);
    let distinct: Vec<Vec<BlockHash>> = (0..groups)
        .map(|g| {
            let family = (g / FAMILY_SIZE) as u64;
            let mut prompt = tokens(family, PROMPT_TOKENS / 4);
            prompt.extend(tokens(
                1_000_000 + seed * 100_000 + g as u64,
                PROMPT_TOKENS * 3 / 4,
            ));
            hash_prompts("model", "", &[Prompt::Tokens(&prompt)], spec).concat()
        })
        .collect();
    // Samples of one prompt arrive interleaved with the others, as a rollout driver sends them.
    (0..requests)
        .map(|i| distinct[i % groups].clone())
        .collect()
}

fn whole_batch(prompts: &[Vec<BlockHash>]) -> Vec<BatchRequest<'_>> {
    prompts
        .iter()
        .map(|blocks| BatchRequest {
            blocks,
            allowed_replicas: None,
        })
        .collect()
}

fn replica_list(ids: &[String]) -> Vec<Replica<'_>> {
    ids.iter()
        .map(|id| Replica {
            id,
            running_requests: 0,
        })
        .collect()
}
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
fn main() {
    let ids: Vec<String> = (0..16).map(|i| format!("ns/pod-{i:02}-rank-0")).collect();
    let replicas = replica_list(&ids);
    let windows: Vec<Vec<Vec<BlockHash>>> = (0..8).map(|s| window_seeded(10_000, s)).collect();
    let rounds: usize = std::env::args().nth(1).map_or(40, |a| a.parse().unwrap());
    for (mode, balance_by) in [
        ("requests", BalanceBy::Requests),
        ("tokens", BalanceBy::Tokens),
    ] {
        if std::env::var("ONLY").is_ok_and(|o| o != mode) {
            continue;
        }
        let params = PlanParams {
            max_per_replica: Some(GROUP_SIZE),
            min_colocate_blocks: 0,
            balance_by,
        };
        let mut m = Memory::new(MemorySettings {
            capacity_blocks: NonZeroUsize::new(4096).unwrap(),
            load_half_life_ms: 1000,
        });
        for (w, window) in windows.iter().enumerate() {
            assign_with_memory(
                &whole_batch(window),
                &replicas,
                &params,
                &mut m,
                w as u64 * 100,
            );
        }
        let (mut base, mut stream) = (vec![], vec![]);
        for r in 0..rounds {
            let batch = whole_batch(&windows[r % 8]);
            let t = Instant::now();
            black_box(assign(black_box(&batch), &replicas, &params));
            base.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            black_box(assign_with_memory(
                black_box(&batch),
                &replicas,
                &params,
                &mut m,
                (8 + r) as u64 * 100,
            ));
            stream.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (b, s) = (median(base), median(stream));
        println!("{mode}: base {b:.2} ms, stream {s:.2} ms ({:.1}x)", s / b);
    }
}
