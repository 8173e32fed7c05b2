//! The decoder, the index and the block hash on real vLLM 0.32.0 messages recorded as fixtures
//! (`tests/fixtures/vllm-0.32.0/README.md` says how), checked against vLLM's own decoding.

use std::path::PathBuf;

use burst_prefix_engine_state::decode::{decode, BlockHash, Event};
use burst_prefix_engine_state::vllm_hash::{
    block_hash, event_int, none_hash, prompt_block_hashes, DEFAULT_NONE_HASH_SEED,
};
use burst_prefix_engine_state::{ApplyReport, EngineIndex, IndexConfig};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-0.32.0")
}

/// `(seq, raw payload, vLLM's decoding)` of every recorded message, in order.
fn recorded() -> Vec<(u64, Vec<u8>, Value)> {
    let reference = std::fs::read_to_string(dir().join("int.jsonl")).unwrap();
    let out: Vec<_> = reference
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            let seq = v["seq"].as_u64().unwrap();
            let payload = std::fs::read(dir().join(format!("int-{seq}.msgpack"))).unwrap();
            (seq, payload, v)
        })
        .collect();
    assert!(out.len() >= 19, "the fixtures are all there");
    out
}

fn hash_of(v: &Value) -> BlockHash {
    match v {
        Value::Number(n) => BlockHash::Int(n.as_u64().unwrap()),
        Value::Object(o) => {
            let hex = o["bytes"].as_str().unwrap();
            BlockHash::Bytes(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect(),
            )
        }
        other => panic!("a hash: {other}"),
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn every_recorded_batch_decodes_as_vllm_decodes_it() {
    let mut kinds = std::collections::BTreeSet::new();
    for (seq, payload, reference) in recorded() {
        let batch = decode(&payload).unwrap_or_else(|e| panic!("seq {seq}: {e}"));
        // serde_json's float parsing may differ from Python's repr in the last bit.
        let ts = reference["ts"].as_f64().unwrap();
        assert!(
            (batch.ts - ts).abs() < 1e-6,
            "seq {seq}: {} vs {ts}",
            batch.ts
        );
        assert_eq!(
            batch.data_parallel_rank,
            reference["data_parallel_rank"].as_i64()
        );
        assert_eq!(batch.unknown_events(), 0);
        let want = reference["events"].as_array().unwrap();
        assert_eq!(batch.events.len(), want.len(), "seq {seq}");
        for (got, want) in batch.events.iter().zip(want) {
            match (got, want["type"].as_str().unwrap()) {
                (Event::BlockStored(s), "BlockStored") => {
                    let hashes: Vec<_> = want["block_hashes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(hash_of)
                        .collect();
                    assert_eq!(s.block_hashes, hashes, "seq {seq}");
                    let parent = (!want["parent_block_hash"].is_null())
                        .then(|| hash_of(&want["parent_block_hash"]));
                    assert_eq!(s.parent_block_hash, parent, "seq {seq}");
                    assert_eq!(s.token_ids, ids(&want["token_ids"]), "seq {seq}");
                    assert_eq!(s.block_size as u64, want["block_size"].as_u64().unwrap());
                    assert_eq!(s.medium.as_deref(), want["medium"].as_str());
                    assert_eq!(s.lora_name.as_deref(), want["lora_name"].as_str());
                    assert_eq!(s.group_idx.map(u64::from), want["group_idx"].as_u64());
                    let extra = want["extra_keys"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|x| !x.is_null()));
                    assert_eq!(s.has_extra_keys, extra);
                    kinds.insert("BlockStored");
                }
                (Event::BlockRemoved(r), "BlockRemoved") => {
                    let hashes: Vec<_> = want["block_hashes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(hash_of)
                        .collect();
                    assert_eq!(r.block_hashes, hashes, "seq {seq}");
                    assert_eq!(r.medium.as_deref(), want["medium"].as_str());
                    kinds.insert("BlockRemoved");
                }
                (Event::AllBlocksCleared, "AllBlocksCleared") => {
                    kinds.insert("AllBlocksCleared");
                }
                (got, want) => panic!("seq {seq}: decoded {got:?}, vLLM says {want}"),
            }
        }
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["AllBlocksCleared", "BlockRemoved", "BlockStored"],
        "the fixtures cover every event type"
    );
}

#[test]
fn the_recorded_stream_applies_to_the_index_without_unknown_parents_or_removals() {
    let mut index = EngineIndex::new(IndexConfig::default());
    let mut total = ApplyReport::default();
    for (_, payload, _) in recorded() {
        let r = index.apply("rec", &decode(&payload).unwrap());
        total.stored += r.stored;
        total.removed += r.removed;
        total.removed_unknown += r.removed_unknown;
        total.unknown_parent += r.unknown_parent;
        total.cleared += r.cleared;
        total.malformed += r.malformed;
    }
    assert_eq!(total.unknown_parent, 0, "{total:?}");
    assert_eq!(total.removed_unknown, 0, "{total:?}");
    assert_eq!(total.malformed, 0, "{total:?}");
    assert_eq!(total.cleared, 1);
    assert!(total.removed > 0);
    // The engine's cache has 24 blocks; what the index holds never exceeds it.
    assert!(
        index.blocks_held("rec") <= 24,
        "{}",
        index.blocks_held("rec")
    );
    assert_eq!(index.block_size("rec"), Some(128));
}

#[test]
fn our_sha256_cbor_hashes_equal_the_recorded_ones_including_a_child_of_a_parent() {
    let all = recorded();
    // Every BlockStored without a parent: its hashes from its own token ids.
    let mut roots = 0;
    for (seq, payload, _) in &all {
        for e in decode(payload).unwrap().events {
            if let Event::BlockStored(s) = e {
                if s.parent_block_hash.is_none() {
                    let ours: Vec<u64> = prompt_block_hashes(
                        &s.token_ids,
                        s.block_size as usize,
                        DEFAULT_NONE_HASH_SEED,
                    )
                    .iter()
                    .map(event_int)
                    .collect();
                    let theirs: Vec<u64> = s.block_hashes.iter().map(BlockHash::as_u64).collect();
                    assert_eq!(ours, theirs, "seq {seq}");
                    roots += 1;
                }
            }
        }
    }
    assert!(roots >= 10);
    // seq 18 extends seq 17's prompt: the chain continues from seq 17's last digest.
    let stored = |seq: u64| match &decode(&all.iter().find(|m| m.0 == seq).unwrap().1)
        .unwrap()
        .events
        .iter()
        .rev()
        .find(|e| matches!(e, Event::BlockStored(_)))
        .unwrap()
    {
        Event::BlockStored(s) => s.clone(),
        _ => unreachable!(),
    };
    let (parent, child) = (stored(17), stored(18));
    let mut h = none_hash(DEFAULT_NONE_HASH_SEED);
    for block in parent.token_ids.chunks(128) {
        h = block_hash(&h, block);
    }
    assert_eq!(
        Some(event_int(&h)),
        child.parent_block_hash.as_ref().map(BlockHash::as_u64)
    );
    for (block, theirs) in child.token_ids.chunks(128).zip(&child.block_hashes) {
        h = block_hash(&h, block);
        assert_eq!(event_int(&h), theirs.as_u64());
    }
}

#[test]
fn truncated_or_corrupted_recorded_payloads_are_errors_not_panics() {
    for (_, payload, _) in recorded().into_iter().take(3) {
        for cut in [0, 1, payload.len() / 2, payload.len() - 1] {
            assert!(decode(&payload[..cut]).is_err());
        }
        let mut extra = payload.clone();
        extra.push(0xc0);
        assert!(decode(&extra).is_err(), "trailing bytes");
        for i in (0..payload.len()).step_by(7) {
            let mut flipped = payload.clone();
            flipped[i] ^= 0xff;
            let _ = decode(&flipped);
        }
    }
}
