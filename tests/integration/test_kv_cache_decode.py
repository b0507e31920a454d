"""Greedy decode through the paged (and contiguous) KV cache equals full recomputation, every family."""

from __future__ import annotations

import pytest
import torch

from checkpoints import FAMILIES, save_tiny
from decode_helpers import decode_by_recompute, decode_with_cache
from infer.loader.model_loader import load_model


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["paged", "contiguous"])
def test_cached_greedy_equals_recompute(family, mode, tmp_path):
    model = load_model(save_tiny(family, tmp_path, seed=5), torch.float32).model
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 11, 2)]
    steps = 12  # crosses block boundaries and the Gemma fixture's sliding window (6)
    if mode == "paged":
        got = decode_with_cache(model, prompts, steps, block_size=4, num_blocks=32)
    else:
        got = decode_with_cache(model, prompts, steps, block_size=64, num_blocks=3)
    want = [decode_by_recompute(model, p, steps) for p in prompts]
    assert got == want
