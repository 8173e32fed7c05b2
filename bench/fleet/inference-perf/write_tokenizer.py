"""Writes the offline tokenizer inference-perf counts and generates prompts with (no model hub).

usage: python write_tokenizer.py OUT_DIR   (in the inference-perf venv: setup.sh runs it)

A word-level Hugging Face tokenizer whose tokens are whole lowercase words of three syllables
(24^3 = 13,824 words, the syllables of crates/engine-bench/src/prompts.rs), split on whitespace.
llm-d-inference-sim's dummy tokenizer (`--force-dummy-tokenizer`) makes one token of each run of
word characters and its trailing spaces, so a text of N of these words is N tokens to both: the
prompt lengths inference-perf asks for are the lengths the simulator prices.
"""

import itertools
import sys

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SYLLABLES = [
    "ka", "lo", "mi", "ne", "ra", "tu", "shi", "po", "ven", "dor", "al", "ex", "qu", "ib", "zor",
    "fen", "gal", "hum", "jet", "wix", "ur", "oy", "ze", "bri",
]


def main(out_dir: str) -> None:
    vocab = {"[UNK]": 0}
    for parts in itertools.product(SYLLABLES, repeat=3):
        vocab.setdefault("".join(parts), len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.save_pretrained(out_dir)
    sample = "kalomi nerazor bribrizor"
    ids = fast.encode(sample)
    decoded = fast.decode(ids)
    if len(ids) != 3 or decoded != sample:
        sys.exit(f"the tokenizer does not round-trip {sample!r}: {ids} -> {decoded!r}")
    print(f"tokenizer: {len(vocab)} words, written to {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python write_tokenizer.py OUT_DIR")
    main(sys.argv[1])
