//! vLLM's `sha256_cbor` block hash (`--prefix-caching-hash-algo sha256_cbor`), computed from
//! token ids, so that a router can check that its tokenization equals the engine's.
//!
//! `h_i = sha256(cbor([h_{i-1} (32 bytes), [the block's token ids], null]))` with canonical CBOR,
//! `h_{-1} = NONE_HASH = sha256(cbor(seed))`, the seed being `"vllm-none-hash"` (or the engine's
//! `PYTHONHASHSEED` when that is set). Only full blocks are hashed. KV events carry the digest's
//! last 8 bytes as a big-endian integer ([`event_int`]) unless
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, when they carry the 32 bytes.
//!
//! The engine index keys blocks by its own chain key ([`crate::index::chain_keys`]), which works
//! whatever hash algorithm the engine runs; this module is for checking, not for lookups.

use ciborium::Value;
use sha2::{Digest, Sha256};

/// The seed vLLM hashes into `NONE_HASH` when `PYTHONHASHSEED` is not set.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// A 32-byte sha256 digest.
pub type Digest32 = [u8; 32];

fn sha256_cbor(value: &Value) -> Digest32 {
    let mut buf = Vec::with_capacity(64);
    // Writing to a Vec cannot fail, and these values (bytes, unsigned integers, arrays, text,
    // null) are all encodable.
    ciborium::into_writer(value, &mut buf).expect("CBOR into a Vec");
    Sha256::digest(&buf).into()
}

/// `NONE_HASH` for a seed: `sha256(cbor(seed))`.
pub fn none_hash(seed: &str) -> Digest32 {
    sha256_cbor(&Value::Text(seed.to_owned()))
}

/// One block's hash from its parent's digest and its token ids (no extra keys).
pub fn block_hash(parent: &Digest32, block_tokens: &[u32]) -> Digest32 {
    let tokens = block_tokens
        .iter()
        .map(|&t| Value::Integer(t.into()))
        .collect();
    sha256_cbor(&Value::Array(vec![
        Value::Bytes(parent.to_vec()),
        Value::Array(tokens),
        Value::Null,
    ]))
}

/// The hashes of a prompt's full blocks, in order, from `NONE_HASH` of `seed`.
/// An empty result when `block_size` is 0 or the prompt is shorter than one block.
pub fn prompt_block_hashes(token_ids: &[u32], block_size: usize, seed: &str) -> Vec<Digest32> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = none_hash(seed);
    token_ids
        .chunks_exact(block_size)
        .map(|block| {
            parent = block_hash(&parent, block);
            parent
        })
        .collect()
}

/// The integer KV events carry for a digest: its last 8 bytes, big-endian.
pub fn event_int(digest: &Digest32) -> u64 {
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&digest[24..]);
    u64::from_be_bytes(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn none_hash_is_sha256_of_the_cbor_text_string() {
        // cbor("vllm-none-hash") = 0x6e (text, length 14) followed by the UTF-8 bytes.
        let mut cbor = vec![0x6e];
        cbor.extend_from_slice(b"vllm-none-hash");
        let want: Digest32 = Sha256::digest(&cbor).into();
        assert_eq!(hex(&none_hash(DEFAULT_NONE_HASH_SEED)), hex(&want));
    }

    #[test]
    fn block_hash_encodes_canonical_cbor_with_minimal_integers() {
        // [h (bytes 32), [1, 24, 256, 70000], null] written out by hand, as cbor2's canonical
        // encoder writes it: each integer in its shortest form.
        let parent = [7u8; 32];
        let mut cbor = vec![0x83, 0x58, 0x20];
        cbor.extend_from_slice(&parent);
        cbor.extend_from_slice(&[0x84, 0x01, 0x18, 24, 0x19, 0x01, 0x00]);
        cbor.extend_from_slice(&[0x1a, 0x00, 0x01, 0x11, 0x70]);
        cbor.push(0xf6);
        let want: Digest32 = Sha256::digest(&cbor).into();
        assert_eq!(hex(&block_hash(&parent, &[1, 24, 256, 70000])), hex(&want));
    }

    #[test]
    fn prompt_hashes_chain_over_full_blocks_only() {
        let tokens: Vec<u32> = (0..10).collect();
        let hashes = prompt_block_hashes(&tokens, 4, DEFAULT_NONE_HASH_SEED);
        assert_eq!(
            hashes.len(),
            2,
            "the 2 trailing tokens are not a full block"
        );
        let h0 = block_hash(&none_hash(DEFAULT_NONE_HASH_SEED), &[0, 1, 2, 3]);
        assert_eq!(hashes[0], h0);
        assert_eq!(hashes[1], block_hash(&h0, &[4, 5, 6, 7]));
        assert!(prompt_block_hashes(&tokens, 0, DEFAULT_NONE_HASH_SEED).is_empty());
    }

    #[test]
    fn event_int_is_the_last_eight_bytes_big_endian() {
        let mut d = [0u8; 32];
        d[24..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        d[0] = 0xff;
        assert_eq!(event_int(&d), 0x0102030405060708);
    }
}
