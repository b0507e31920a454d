"""The all-reduce's path rule: the one-shot symmetric-memory path for small GPU tensors of supported dtypes in whole
16-byte vectors, NCCL (or gloo) otherwise, decided from the tensor's shape alone so every rank takes the same path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from layerzero.kernels.reference.collectives import ONE_SHOT_MAX_BYTES, one_shot_eligible


def _tensor(nbytes: int, dtype: torch.dtype = torch.bfloat16, cuda: bool = True) -> torch.Tensor:
    return SimpleNamespace(is_cuda=cuda, dtype=dtype, nbytes=nbytes)  # type: ignore[return-value]


@pytest.mark.parametrize(("nbytes", "dtype", "cuda", "one_shot"), [
    (8 * 1024, torch.bfloat16, True, True),  # a batch-1 decode step's hidden row of the 8B shape
    (ONE_SHOT_MAX_BYTES, torch.float32, True, True),
    (ONE_SHOT_MAX_BYTES + 16, torch.bfloat16, True, False),  # prefill sizes: NCCL
    (8 * 1024, torch.float16, True, False),  # not a dtype the symmetric-memory reductions are built for
    (8 * 1024 + 2, torch.bfloat16, True, False),  # not whole 16-byte vectors
    (8 * 1024, torch.bfloat16, False, False),  # CPU tensors: gloo
])
def test_one_shot_rule(nbytes, dtype, cuda, one_shot):
    assert one_shot_eligible(_tensor(nbytes, dtype, cuda)) is one_shot


def test_a_real_cpu_tensor_takes_gloo():
    assert not one_shot_eligible(torch.ones(4, dtype=torch.bfloat16))
