"""Start-up warm-up: run the step shapes serving will meet once, so the first real batch runs at steady speed.

On CUDA the first prefill of each shape compiles Triton kernels and makes layerzero's selections; decode
buckets are captured as graphs when the runner is built, but prefill chunks, mixed steps and the sampler's
variants are not. The warm-up admits requests of random token ids whose prompts span the prefill chunk sizes (a
full chunk, a short remainder, a single token) and decodes a few steps with them, then leaves the engine as it
found it: no request, an empty prefix cache, zeroed counters. The sampler's kernels depend on which rows sample
(all greedy rows read the logits in their own dtype, sampled ones in float32) and on how many (the argmax's block
size), so on CUDA every group runs greedy and sampled, and small groups of 1-8 rows run beside the large one.
Without decode graphs, groups of 128 and 256 requests decode too: the attention's tile follows the batch.
"""

from __future__ import annotations

import random
import time

from infer.engine.core import EngineCore
from infer.sampling.params import SamplingParams

WARMUP_DECODE_TOKENS = 4
SMALL_GROUPS = (1, 2, 3, 4, 6, 8)  # requests at once, each a short prompt: steps that sample that many rows
# without decode graphs, decode batches this large run eagerly: the paged attention's tile follows the programs per
# SM (docs/gpu.md), so they compile tiles that a capture would otherwise have compiled
EAGER_DECODE_GROUPS = (128, 256)


def warm_up(engine: EngineCore) -> float:
    """Warm the engine's kernels and shapes; the seconds it took."""
    started = time.perf_counter()
    config = engine.config
    rng = random.Random(0)
    chunk = min(config.prefill_chunk_size, config.max_seq_len - WARMUP_DECODE_TOKENS - 1)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=WARMUP_DECODE_TOKENS, ignore_eos=True, seed=0)
    if engine.runner.device.type == "cuda":
        large = [chunk + chunk // 2, chunk, 17, 1]
        large += [rng.randrange(2, 64) for _ in range(min(config.max_batch_size, 64) - 4)]
        groups = [large] + [[rng.randrange(2, 64) for _ in range(n)] for n in SMALL_GROUPS if n < len(large)]
        if getattr(engine.runner, "graphs", None) is None:
            groups += [[rng.randrange(2, 16) for _ in range(n)] for n in EAGER_DECODE_GROUPS
                       if len(large) < n <= config.max_batch_size]
        greedy = SamplingParams(temperature=0.0, max_tokens=WARMUP_DECODE_TOKENS, ignore_eos=True)
        rounds = [(group, params) for params in (greedy, sampled) for group in groups]
    else:  # the CPU's steps are compute-bound from the first: warm the code paths, not every shape
        rounds = [([min(chunk, 24), 3], sampled)]
    vocab = engine.runner.vocab_size
    for r, (lengths, params) in enumerate(rounds):
        for i, n in enumerate(lengths):
            n = max(1, min(n, config.max_seq_len - WARMUP_DECODE_TOKENS - 1))
            EngineCore.add_request(engine, [rng.randrange(vocab) for _ in range(n)], params, f"warmup-{r}-{i}")
        while engine.has_unfinished():
            engine.step_core()
    engine.kv.reset_prefix_cache()
    engine.scheduler.num_preemptions = 0
    return time.perf_counter() - started
