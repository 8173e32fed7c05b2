"""Writes a tiny random-weight llama-architecture GGUF model for the engine bench.

No weights can be downloaded here, and none are needed to measure prefill: a prompt costs the
same compute whatever the weights say. The vocabulary is SentencePiece-style (`<unk>`, `<s>`,
`</s>`, the 256 byte tokens, the printable ASCII characters and a few word pieces) so that text
prompts tokenize too; the bench itself sends token IDs. The weights are seeded, so the same
arguments write the same file.

Usage: write_model.py OUT.gguf [--layers 4] [--width 256] [--context 8192] [--seed 1]
"""

import argparse
import os

import gguf
import numpy as np

WORD_PIECES = [
    "the", "and", "ing", "ion", "you", "are", "for", "that", "with", "this", "is", "an", "to",
    "of", "in", "on", "er", "re", "at", "es", "prompt", "cache", "token", "model", "answer",
]
SPACE = "\u2581"  # SentencePiece's word boundary


def vocabulary():
    """(pieces, scores, types): special tokens, bytes, characters, then word pieces."""
    pieces = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    chars = [SPACE if c == " " else c for c in map(chr, range(0x20, 0x7F))]
    words = [SPACE + w for w in WORD_PIECES] + WORD_PIECES
    pieces += chars + words
    types += [gguf.TokenType.NORMAL] * (len(chars) + len(words))
    # Longer pieces score higher, so the SPM merge prefers them.
    scores = [0.0] * 259 + [-1000.0 + len(p) for p in chars + words]
    return pieces, scores, types


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    width, layers = args.width, args.layers
    head_dim = 64
    heads = max(1, width // head_dim)
    ffn = width * 8 // 3 // 32 * 32
    pieces, scores, types = vocabulary()
    rng = np.random.default_rng(args.seed)

    def weights(*shape):
        # numpy shape is ggml's ne reversed: (rows = out features, columns = in features).
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    partial = f"{args.out}.partial.{os.getpid()}"
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name("burst-prefix-bench-tiny")
    writer.add_context_length(args.context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)

    vocab = len(pieces)
    writer.add_tensor("token_embd.weight", weights(vocab, width))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(width, width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(ffn, width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(width, ffn))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, width))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, args.out)
    print(f"wrote {args.out}: llama, {layers} layers x {width} wide, {vocab} tokens")


if __name__ == "__main__":
    main()
