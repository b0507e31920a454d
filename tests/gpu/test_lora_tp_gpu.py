"""LoRA adapters under tensor parallelism on NCCL (needs 2+ GPUs): each rank holds its slice of every adapter (B's rows
of qkv and gate_up, A's columns of o and down); float32 greedy tokens of a batch mixing two adapters and the base
model at TP=2, with CUDA graphs, equal TP=1's."""

from __future__ import annotations

import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import SamplingParams
from lora_adapters import module_shapes, write_random_adapter
from test_tensor_parallel_gpu import GPUS, PROMPTS, in_child

pytestmark = pytest.mark.skipif(GPUS < 2, reason="tensor parallelism on NCCL needs 2 or more CUDA devices")
NAMES = [None, "a0", "a1"]


def test_fp32_greedy_tokens_with_adapters_equal_tp1(tmp_path):
    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    shapes = module_shapes(64, 128, 4, 2, 16)
    modules = {f"a{i}": str(write_random_adapter(tmp_path / f"a{i}", 3, shapes, rank=8, seed=i, dtype=torch.float32,
                                                 scale=0.3)) for i in range(2)}
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, lora=n) for n in NAMES]
    options = dict(dtype="float32", enable_lora=True, max_loras=2, lora_modules=modules, params=params)
    want, _ = in_child(path, "lora", **options)
    got, graphs = in_child(path, "lora", tensor_parallel_size=2, **options)
    assert graphs and got == want
    assert len({tuple(t) for t in want}) == 3  # the adapters change the tokens
