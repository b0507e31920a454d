"""The start-up warm-up on CUDA: after it, batches of any size, greedy or sampled, compile no Triton kernel."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from layerzero.kernels.triton.compiles import Compiles

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_after_the_warm_up_no_batch_compiles_a_kernel(tmp_path):
    llm = LLM(str(save_tiny_with_tokenizer("llama", tmp_path)), device="cuda", dtype="bfloat16", max_seq_len=256,
              max_batch_size=32, kv_cache_memory_gb=0.1)
    assert llm.built.warmup_seconds > 0
    rng = random.Random(0)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6, ignore_eos=True, seed=1)
    with Compiles() as compiles:
        for n in (1, 3, 5, 7, 16, 32):
            for params in (greedy, sampled):
                prompts = [[rng.randrange(1, 300) for _ in range(rng.randint(1, 200))] for _ in range(n)]
                assert all(len(o.token_ids) == 6 for o in llm.generate_ids(prompts, params))
    assert compiles.kernels == []


def test_without_graphs_large_decode_batches_compile_nothing_after_the_warm_up(tmp_path):
    """Eager decode (CUDA graphs off): with 8 KV heads, 100-256 sequences take the paged attention's tiles for many
    programs per SM; the warm-up's large groups compile them before serving."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import model_shapes as ms

    llm = LLM(str(ms.write_model_dir("llama-3.2-1b", tmp_path)), load_format="dummy", use_cuda_graphs=False,
              max_seq_len=256, max_batch_size=256, kv_cache_memory_gb=2)
    rng = random.Random(0)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with Compiles() as compiles:
        for n in (100, 128, 200, 256):
            prompts = [[rng.randrange(1, 1000) for _ in range(rng.randint(1, 40))] for _ in range(n)]
            assert all(len(o.token_ids) == 4 for o in llm.generate_ids(prompts, greedy))
    assert compiles.kernels == []
