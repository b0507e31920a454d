"""Prefill and mixed steps replayed as CUDA graphs: the same greedy tokens and prompt logprobs as every step eager,
for whole prompts, chunked prompts and mixed steps, every family; steps above the largest bucket run eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# prompts of unaligned lengths; the last shares the first's prefix (a prefix-cache hit before its chunk)
PROMPTS = [list(range(3, 3 + n)) for n in (70, 3, 33, 120, 9)] + [list(range(3, 60)) + [200, 201, 202]]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
CASES = {"whole": dict(prefill_chunk_size=512), "chunked": dict(prefill_chunk_size=16),
         "mixed": dict(prefill_chunk_size=16, max_num_batched_tokens=256)}


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    return str(save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param), seed=5))


def _run(path: str, graphs: bool, options: dict) -> tuple[list[list[int]], list[float], int]:
    """Greedy tokens of PROMPTS (admitted together: chunks and decode rows share steps), one prompt's logprobs, and
    how many prefill steps replayed a graph."""
    llm = LLM(path, device="cuda", dtype="float32", max_batch_size=8, max_seq_len=256, kv_cache_memory_gb=0.05,
              use_cuda_graphs=graphs, **options)
    graphs_of = llm.runner.prefill_graphs
    replays = [0]
    if graphs_of is not None:
        replay = graphs_of.replay

        def counted(size: int) -> object:
            replays[0] += 1
            return replay(size)

        graphs_of.replay = counted  # type: ignore[method-assign]
    tokens = [o.token_ids for o in llm.generate_ids(PROMPTS, GREEDY)]
    logprobs = [lp.logprob for step in llm.stream(PROMPTS[2], SamplingParams(temperature=0, max_tokens=1,
                                                                             prompt_logprobs=0))
                if step.prompt_logprobs is not None for lp in step.prompt_logprobs if lp is not None]
    llm.close()
    return tokens, logprobs, replays[0]


@pytest.mark.parametrize("case", list(CASES))
def test_graph_steps_equal_eager_steps(checkpoint, case):
    eager_tokens, eager_logprobs, eager_replays = _run(checkpoint, False, CASES[case])
    tokens, logprobs, replays = _run(checkpoint, True, CASES[case])
    assert eager_replays == 0 and replays > 0
    assert tokens == eager_tokens
    np.testing.assert_allclose(logprobs, eager_logprobs, rtol=1e-4, atol=1e-4)


def test_buckets_follow_the_step_budget(checkpoint):
    llm = LLM(checkpoint, device="cuda", dtype="float32", max_batch_size=4, max_seq_len=256,
              kv_cache_memory_gb=0.05, max_num_batched_tokens=256, prefill_chunk_size=256)
    stats = llm.runner.prefill_graph_stats
    assert stats is not None and stats.batch_sizes == ((16, 4), (32, 4), (64, 4), (128, 4), (256, 4))
    assert stats.memory_bytes > 0
    graphs = llm.runner.prefill_graphs
    assert graphs is not None and graphs.shape(256, 4) == (256, 4) and graphs.shape(257, 1) is None
    llm.close()
