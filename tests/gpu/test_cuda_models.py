"""The same models and runner on CUDA: greedy decode equals the CPU reference; bf16 stays close to fp32."""

from __future__ import annotations

import pytest
import torch

from checkpoints import FAMILIES, save_tiny
from decode_helpers import decode_by_recompute, decode_with_cache
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(params=FAMILIES)
def checkpoint(request, tmp_path):
    return save_tiny(request.param, tmp_path, seed=11)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (4, 13, 7)]


def test_cuda_cached_greedy_equals_cpu(checkpoint):
    cpu = load_model(checkpoint, torch.float32, "cpu").model
    gpu = load_model(checkpoint, torch.float32, "cuda").model
    prompts = _prompts(cpu.config.vocab_size)
    got = decode_with_cache(gpu, prompts, steps=10, block_size=4, num_blocks=32)
    assert got == decode_with_cache(cpu, prompts, steps=10, block_size=4, num_blocks=32)
    assert got == [decode_by_recompute(gpu, p, 10) for p in prompts]


def test_cuda_bf16_logits_close_to_fp32(checkpoint):
    ref = load_model(checkpoint, torch.float32, "cuda").model
    bf16 = load_model(checkpoint, torch.bfloat16, "cuda").model
    ids = torch.tensor(_prompts(ref.config.vocab_size)[1], device="cuda")
    batch = ForwardBatch.for_prompts([ids.numel()], "cuda")
    with torch.no_grad():
        want = ref.compute_logits(ref(ids, batch))
        got = bf16.compute_logits(bf16(ids, batch))
    assert (got - want).abs().max().item() <= 0.02 * want.abs().max().item()
