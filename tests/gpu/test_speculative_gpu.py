"""Speculative decoding on CUDA: greedy tokens identical to plain decoding with CUDA graphs on (decode and verify
steps replay graphs, steps mixing prompt chunks verify eagerly), batched, and clean under INFER_STRICT_SYNC=1."""

from __future__ import annotations

import random

import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32"])
def test_greedy_identical_with_graphs(family: str, dtype: str, tmp_path) -> None:
    path = str(save_tiny_with_tokenizer(family, tmp_path / "model", seed=2))
    rng = random.Random(3)
    prompts = []
    for length, repeats in ((6, 3), (11, 2), (4, 5), (20, 1)):
        piece = [rng.randrange(1, 320) for _ in range(length)]
        prompts.append(piece * repeats)
    options = dict(device="cuda", dtype=dtype, max_seq_len=256, max_batch_size=8, use_cuda_graphs=True,
                   kv_cache_memory_gb=1)  # two engines share the GPU: neither sizes its cache from free memory
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = [o.token_ids for o in LLM(path, **options).generate_ids(prompts, params)]
    spec = LLM(path, speculative_method="ngram", num_speculative_tokens=4, **options)
    assert [o.token_ids for o in spec.generate_ids(prompts, params)] == want
    assert spec.engine.scheduler.num_accepted > 0
    assert spec.engine.kv.audit_blocks() == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_identical_with_a_draft_model_and_graphs(family: str, tmp_path) -> None:
    """The draft-model method: the drafter's passes and the verify on the device, the target's graphs replayed."""
    from checkpoints import save_tiny

    path = str(save_tiny_with_tokenizer(family, tmp_path / "model", seed=2))
    drafter = str(save_tiny(family, tmp_path / "drafter", seed=9, intermediate_size=64))
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 320) for _ in range(n)] for n in (5, 17, 9, 30)]
    options = dict(device="cuda", dtype="float32", max_seq_len=256, max_batch_size=8, use_cuda_graphs=True,
                   kv_cache_memory_gb=1)  # two engines share the GPU: neither sizes its cache from free memory
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.token_ids for o in LLM(path, **options).generate_ids(prompts, params)]
    for draft in (path, drafter):
        spec = LLM(path, speculative_method="draft", draft_model=draft, num_speculative_tokens=3, **options)
        assert [o.token_ids for o in spec.generate_ids(prompts, params)] == want
        assert spec.engine.scheduler.num_drafted > 0
        assert spec.engine.kv.audit_blocks() == {}
