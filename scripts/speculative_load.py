"""n-gram speculation against plain decoding at several batch sizes, offline, on the bundled model (the numbers
behind `speculative_disable_by_batch_size`, docs/speculative.md).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/speculative_load.py plain 1,2,4,8,16
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/speculative_load.py ngram 1,2,4,8,16 [copy]

Modes: plain, ngram (drafting at every batch size), gated (ngram with every proposal dropped). `copy` uses one
passage to repeat instead of 8 mixed chat prompts. Prints generated tok/s per batch size (96 greedy tokens each).
"""

from __future__ import annotations

import sys
import time

from infer import LLM
from infer.sampling.params import SamplingParams

MIXED = ["Repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank.",
         "Write a short story about a robot.", "List the days of the week, then list them again.",
         "What is the capital of France? Explain why.",
         "Copy this: alpha beta gamma delta epsilon zeta eta theta iota kappa.",
         "Describe the ocean.", "Count from one to twenty in words.", "Tell me about cats."]
COPY = ["Repeat the following text exactly, word for word:\n\n" + " ".join(
    ["The committee met on Tuesday to review the budget, and after a long discussion it approved the plan for the "
     "new library, the park and the school."] * 3)]
NEW_TOKENS = 96


def main() -> None:
    mode, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
    texts = COPY if sys.argv[3:] == ["copy"] else MIXED
    options = {} if mode == "plain" else {"speculative_method": "ngram", "num_speculative_tokens": 4,
                                          "speculative_disable_by_batch_size": 0}
    llm = LLM(None, max_seq_len=1024, **options)
    if mode == "gated":
        llm.engine.scheduler.proposer.propose = lambda tokens, limit: []
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    llm.generate_ids([llm.encode_chat([{"role": "user", "content": "hi"}])], SamplingParams(max_tokens=8))  # warm-up
    for batch in batches:
        prompts = [llm.encode_chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(batch)]
        started = time.perf_counter()
        llm.generate_ids(prompts, params)
        elapsed = time.perf_counter() - started
        print(f"{mode} batch {batch}: {batch * NEW_TOKENS / elapsed:.0f} tok/s ({elapsed:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
