"""Logits parity against transformers for tiny random Llama 3 / Qwen 3 / Gemma 3 checkpoints."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from checkpoints import FAMILIES, save_tiny
from infer.debug import activation_diff
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch

FP32_ATOL = 1e-4
# bf16 bound, relative to the largest reference logit. Measured here (max |diff| / max |logit|):
# llama 0.033/2.5 (1.3%), qwen3 0.156/11.5 (1.4%), gemma3 0.125/20.4 (0.6%); fp32 diffs are
# <= 5e-6. We keep norms and rope in float32 where transformers rounds some of them to bf16.
BF16_RTOL_OF_MAX = 0.02


@pytest.fixture(scope="module", params=[(f, s) for f in FAMILIES for s in (False, True)],
                ids=lambda p: f"{p[0]}-{'sharded' if p[1] else 'single'}")
def checkpoint(request, tmp_path_factory):
    family, sharded = request.param
    path = save_tiny(family, tmp_path_factory.mktemp(family), sharded=sharded)
    if sharded:
        assert (path / "model.safetensors.index.json").exists()
    return family, path


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 17, 9, 1][:n]
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


def _our_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    ids = torch.tensor([t for p in prompts for t in p])
    with torch.no_grad():
        logits = model.compute_logits(model(ids, ForwardBatch.for_prompts([len(p) for p in prompts])))
    return list(logits.split([len(p) for p in prompts]))


def _max_diff(ours: list[torch.Tensor], hf, prompts: list[list[int]]) -> tuple[float, float]:
    """(max |ours - reference|, max |reference|) over all prompts and positions."""
    worst, largest = 0.0, 0.0
    with torch.no_grad():
        for got, prompt in zip(ours, prompts):
            ref = hf(torch.tensor([prompt])).logits[0].float()
            worst = max(worst, (got - ref).abs().max().item())
            largest = max(largest, ref.abs().max().item())
    return worst, largest


def _models(path, dtype: torch.dtype):
    """(our model, transformers' model) from the same checkpoint directory."""
    return load_model(path, dtype).model, AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def test_full_model_logits_fp32(checkpoint):
    ours, hf = _models(checkpoint[1], torch.float32)
    prompts = _prompts(4, ours.config.vocab_size, seed=1)
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert largest > 1.0 and diff <= FP32_ATOL


def test_single_layer_and_every_hook_point_fp32(checkpoint):
    ours, hf = _models(checkpoint[1], torch.float32)
    rows = activation_diff(ours, hf, _prompts(2, ours.config.vocab_size, seed=2)[1])
    assert rows[0].name == "blocks.0.resid_post"
    for row in rows:
        assert row.ref_max > 0.1, f"{row.name}: reference activations are ~0, the test would be vacuous"
        assert row.max_abs <= FP32_ATOL, f"{row.name}: {row.max_abs}"


def test_full_model_logits_bf16(checkpoint):
    ours, hf = _models(checkpoint[1], torch.bfloat16)
    prompts = _prompts(3, ours.config.vocab_size, seed=3)
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert diff <= BF16_RTOL_OF_MAX * largest
