#!/usr/bin/env python3
"""Write a tiny random-weight Llama model + a locally trained byte-level BPE
tokenizer into OUT_DIR, in a layout that vLLM's server accepts (tests/vllm/setup.sh runs it).

No weights can be downloaded here, and none are needed: a prompt costs the same compute
whatever the weights say. The tokenizer is trained on generated text and the weights are
seeded, so the model is the same on every machine.

usage: python make_tiny_model.py OUT_DIR [--layers 4] [--hidden 256] [--vocab 4096]
"""
import argparse
import json
import os
import random

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

SYLLABLES = ["ka", "lo", "mi", "ne", "ra", "tu", "shi", "po", "ven", "dor", "al", "ex",
             "qu", "ib", "zor", "fen", "gal", "hum", "jet", "wix", "ur", "oy", "ze", "bri"]


def corpus(n_lines: int, seed: int = 0):
    rnd = random.Random(seed)
    words = ["".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 3))) for _ in range(3000)]
    words += ("the of and to in is you that it he was for on are as with his they at be "
              "this have from or one had by word but not what all were we when your can said "
              "system user assistant request prompt answer question context document").split()
    for _ in range(n_lines):
        yield " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 40))) + rnd.choice([".", "?", "!", ","])
    # digits / punctuation so arbitrary text tokenizes compactly
    for i in range(2000):
        yield f"{i} {i*7} {i*13}: ({i}) [{i}] {{'k': {i}}} {i/3:.3f} - _ # @ $ % ^ & * + = / \\ | ~ `"


def build_tokenizer(out_dir: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|system|>", "<|user|>",
               "<|assistant|>", "<|end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(20000), trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|pad|>",
        "add_bos_token": True,
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": cfg["bos_token"], "eos_token": cfg["eos_token"],
                   "pad_token": cfg["pad_token"]}, f, indent=2)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-pos", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)

    tok = build_tokenizer(a.out_dir, a.vocab)
    vocab = tok.get_vocab_size()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 2,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.max_pos,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<|begin_of_text|>"),
        eos_token_id=tok.token_to_id("<|end_of_text|>"),
        pad_token_id=tok.token_to_id("<|pad|>"),
    )
    model = LlamaForCausalLM(cfg).to(getattr(torch, a.dtype))
    model.save_pretrained(a.out_dir, safe_serialization=True)
    # generation_config.json is written by save_pretrained; keep sampling neutral
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out_dir}: vocab={vocab} layers={a.layers} hidden={a.hidden} params={n/1e6:.2f}M dtype={a.dtype}")


if __name__ == "__main__":
    main()
