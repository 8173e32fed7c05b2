"""Records the engine answers that crates/engine-bench/tests/ check the bench's parser and lower
bound against: steps of token-ID prompts sent one at a time to one fresh llama-server, and what it
answered, into tests/fixtures/sequential-run.json.

Usage: record_fixtures.py http://127.0.0.1:PORT OUT.json  (the replica must be fresh)
"""

import json
import random
import sys
import urllib.request


def complete(url, prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0,
                       "ignore_eos": True, "cache_prompt": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def main():
    url, out = sys.argv[1], sys.argv[2]
    rng = random.Random(7)
    tokens = lambda n: [rng.randrange(3, 404) for _ in range(n)]
    a, b, c, d = tokens(300), tokens(50), tokens(100), tokens(40)
    steps = [[a, a, a[:200] + b], [c, a + d]]
    answers = [[complete(url, prompt) for prompt in step] for step in steps]
    with open(out, "w") as f:
        json.dump({"steps": steps, "answers": answers}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
