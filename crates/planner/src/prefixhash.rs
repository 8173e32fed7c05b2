//! Prefix blocks, bit-identical to llm-d's shared `prefixhash` package (docs/behaviour.md §1).
//!
//! Each prompt is a chain: `prev = XXH64(model ++ cache_salt)`, then for every block of
//! `block_size_tokens` tokens (the trailing partial block is kept)
//! `hash = XXH64(LE64(XXH64(LE32 token bytes)) ++ LE64(prev))`.

use xxhash_rust::xxh64::{xxh64, Xxh64};

/// One chained block hash.
pub type BlockHash = u64;

/// The cap on blocks per prompt when `maxPrefixTokensToMatch` is 0.
pub const DEFAULT_MAX_BLOCKS: usize = 2048;

/// A prompt as the hasher sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prompt<'a> {
    /// Token IDs from a tokenizer.
    Tokens(&'a [u32]),
    /// Text without a tokenizer: its UTF-8 bytes, zero-padded to a multiple of 4, read as
    /// little-endian `u32` "estimate" tokens (about 4 bytes per token).
    Text(&'a str),
}

impl Prompt<'_> {
    /// Number of (estimate) tokens in this prompt.
    pub fn token_count(&self) -> usize {
        match self {
            Prompt::Tokens(tokens) => tokens.len(),
            Prompt::Text(text) => text.len().div_ceil(4),
        }
    }
}

/// How prompts are cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpec {
    pub block_size_tokens: usize,
    /// Blocks kept per prompt (llm-d's `computeBlockHashes` caps each prompt, not the request).
    pub max_blocks: usize,
}

impl BlockSpec {
    /// `maxBlocks = maxPrefixTokensToMatch / blockSizeTokens` when the former is > 0, else 2048.
    /// `block_size_tokens` must be >= 1 (the config validation guarantees it).
    pub fn new(block_size_tokens: usize, max_prefix_tokens_to_match: usize) -> Self {
        assert!(block_size_tokens >= 1, "block_size_tokens must be >= 1");
        let max_blocks = if max_prefix_tokens_to_match > 0 {
            max_prefix_tokens_to_match / block_size_tokens
        } else {
            DEFAULT_MAX_BLOCKS
        };
        BlockSpec {
            block_size_tokens,
            max_blocks,
        }
    }
}

/// The seed of every chain of one request: `XXH64(model ++ cache_salt)`.
pub fn chain_seed(model: &str, cache_salt: &str) -> BlockHash {
    let mut hasher = Xxh64::new(0);
    hasher.update(model.as_bytes());
    hasher.update(cache_salt.as_bytes());
    hasher.digest()
}

/// Block hashes of one request, per non-empty prompt (empty prompts are skipped), each prompt
/// capped at `spec.max_blocks` blocks.
pub fn hash_prompts(
    model: &str,
    cache_salt: &str,
    prompts: &[Prompt<'_>],
    spec: BlockSpec,
) -> Vec<Vec<BlockHash>> {
    let seed = chain_seed(model, cache_salt);
    // Saturating: a valid config's block may exceed any prompt (blockSizeTokens is any i64 >= 1),
    // and is then one block per prompt; `* 4` would overflow past usize::MAX / 4.
    let block_bytes = spec.block_size_tokens.saturating_mul(4);
    #[cfg(not(target_endian = "little"))]
    let mut token_bytes = Vec::new();
    let mut chains = Vec::new();
    for prompt in prompts {
        let bytes: &[u8] = match prompt {
            Prompt::Text(text) => text.as_bytes(),
            // On little-endian machines the token slice already is its LE bytes: no copy.
            #[cfg(target_endian = "little")]
            Prompt::Tokens(tokens) => bytemuck::cast_slice(tokens),
            #[cfg(not(target_endian = "little"))]
            Prompt::Tokens(tokens) => {
                token_bytes.clear();
                token_bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
                &token_bytes
            }
        };
        if bytes.is_empty() {
            continue;
        }
        chains.push(hash_chain(seed, bytes, block_bytes, spec.max_blocks));
    }
    chains
}

/// Hashes `bytes` (LE u32 token bytes, or text whose last block is zero-padded to 4 bytes here)
/// into at most `max_blocks` chained blocks.
fn hash_chain(
    seed: BlockHash,
    bytes: &[u8],
    block_bytes: usize,
    max_blocks: usize,
) -> Vec<BlockHash> {
    let mut prev = seed;
    let mut chain = Vec::with_capacity(bytes.len().div_ceil(block_bytes).min(max_blocks));
    for block in bytes.chunks(block_bytes).take(max_blocks) {
        let content = if block.len() % 4 == 0 {
            xxh64(block, 0)
        } else {
            let mut padded = block.to_vec();
            padded.resize(block.len().next_multiple_of(4), 0);
            xxh64(&padded, 0)
        };
        let mut link = [0u8; 16];
        link[..8].copy_from_slice(&content.to_le_bytes());
        link[8..].copy_from_slice(&prev.to_le_bytes());
        prev = xxh64(&link, 0);
        chain.push(prev);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(block: usize) -> BlockSpec {
        BlockSpec::new(block, 0)
    }

    #[test]
    fn xxh64_vectors() {
        assert_eq!(xxh64(b"", 0), 0xef46db3751d8e999);
        assert_eq!(xxh64(b"abc", 0), 0x44bc2cf5ad770999);
    }

    #[test]
    fn token_vector_without_salt() {
        let tokens: Vec<u32> = (1..=10).collect();
        let chains = hash_prompts("m", "", &[Prompt::Tokens(&tokens)], spec(4));
        assert_eq!(
            chains,
            vec![vec![
                0xff375b446cd15b25,
                0xd0e13dbe79e3cd40,
                0x6c0f38e4493e1b53
            ]]
        );
    }

    #[test]
    fn token_vector_with_salt() {
        let tokens: Vec<u32> = (1..=10).collect();
        let chains = hash_prompts("m", "salt", &[Prompt::Tokens(&tokens)], spec(4));
        assert_eq!(
            chains,
            vec![vec![
                0x71966444900f601d,
                0x2df7485150fcee96,
                0xa760a4765b4d3be5
            ]]
        );
    }

    #[test]
    fn chat_estimate_vectors() {
        let text = "systemYou are a helpful assistant.userHello!";
        assert_eq!(Prompt::Text(text).token_count(), 11);
        assert_eq!(
            hash_prompts("llama", "", &[Prompt::Text(text)], spec(4)),
            vec![vec![
                0xe77a870ac50a0797,
                0x24079cc05ca07818,
                0x7a8b7d23187ae718
            ]]
        );
        assert_eq!(
            hash_prompts("llama", "", &[Prompt::Text(text)], spec(64)),
            vec![vec![0x0fafa73bef220adc]]
        );
    }

    #[test]
    fn text_equals_its_estimate_tokens() {
        // "abcde" pads to "abcde\0\0\0": two LE u32 tokens.
        let tokens = [
            u32::from_le_bytes(*b"abcd"),
            u32::from_le_bytes([b'e', 0, 0, 0]),
        ];
        for block in [1, 2, 3] {
            assert_eq!(
                hash_prompts("m", "s", &[Prompt::Text("abcde")], spec(block)),
                hash_prompts("m", "s", &[Prompt::Tokens(&tokens)], spec(block)),
            );
        }
    }

    #[test]
    fn short_prompt_gives_one_block_and_empty_gives_none() {
        let chains = hash_prompts("m", "", &[Prompt::Tokens(&[7, 8])], spec(64));
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].len(), 1);
        assert!(hash_prompts("m", "", &[Prompt::Tokens(&[])], spec(4)).is_empty());
        assert!(hash_prompts("m", "", &[Prompt::Text("")], spec(4)).is_empty());
        assert!(hash_prompts("m", "", &[], spec(4)).is_empty());
    }

    #[test]
    fn a_block_larger_than_usize_max_over_4_bytes_is_one_block() {
        // blockSizeTokens 2^62 (with a memory as large) is a valid config, and
        // `block_size_tokens * 4` overflowed: a panic in debug builds, 0-byte blocks in release
        // ones (`chunks(0)` panicked), and wrong blocks past 2^62. Seen while writing the
        // producer_config fuzz target, which hashes under every accepted config.
        let tokens: Vec<u32> = (1..=10).collect();
        let whole = hash_prompts("m", "", &[Prompt::Tokens(&tokens)], spec(10));
        for block in [1 << 62, (1 << 62) + 1, usize::MAX] {
            assert_eq!(
                hash_prompts("m", "", &[Prompt::Tokens(&tokens)], spec(block)),
                whole
            );
            assert_eq!(
                hash_prompts("m", "", &[Prompt::Text("abcde")], spec(block)),
                hash_prompts("m", "", &[Prompt::Text("abcde")], spec(2)),
            );
        }
    }

    #[test]
    fn each_prompt_starts_its_own_chain_and_empty_ones_are_skipped() {
        let tokens: Vec<u32> = (1..=10).collect();
        let one = hash_prompts("m", "", &[Prompt::Tokens(&tokens)], spec(4));
        let three = hash_prompts(
            "m",
            "",
            &[
                Prompt::Tokens(&tokens),
                Prompt::Text(""),
                Prompt::Tokens(&tokens),
            ],
            spec(4),
        );
        assert_eq!(three, vec![one[0].clone(), one[0].clone()]);
    }

    #[test]
    fn cap_applies_per_prompt() {
        // docs/behaviour.md §1's vector (computed by llm-d's own Go code): maxBlocks 2, for each
        // prompt.
        let first: Vec<u32> = (1..=10).collect();
        let second: Vec<u32> = (11..=20).collect();
        let capped = hash_prompts(
            "m",
            "",
            &[Prompt::Tokens(&first), Prompt::Tokens(&second)],
            BlockSpec::new(4, 8),
        );
        assert_eq!(
            capped,
            vec![
                vec![0xff375b446cd15b25, 0xd0e13dbe79e3cd40],
                vec![0xdcd7cb35837e16f6, 0x0dfd351685de08aa],
            ]
        );
        // A cap above a prompt's length keeps all of it, and each prompt is capped on its own.
        let capped = hash_prompts(
            "m",
            "",
            &[Prompt::Tokens(&first), Prompt::Tokens(&first[..4])],
            BlockSpec::new(4, 8),
        );
        assert_eq!(capped.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
        let capped = hash_prompts(
            "m",
            "",
            &[Prompt::Tokens(&first), Prompt::Tokens(&first)],
            BlockSpec::new(4, 16),
        );
        assert_eq!(capped.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3]);
        assert_eq!(BlockSpec::new(64, 0).max_blocks, DEFAULT_MAX_BLOCKS);
        assert_eq!(BlockSpec::new(64, 100).max_blocks, 1);
    }

    #[test]
    fn model_separates_chains() {
        let tokens: Vec<u32> = (1..=10).collect();
        assert_ne!(
            hash_prompts("a", "", &[Prompt::Tokens(&tokens)], spec(4)),
            hash_prompts("b", "", &[Prompt::Tokens(&tokens)], spec(4)),
        );
    }
}
