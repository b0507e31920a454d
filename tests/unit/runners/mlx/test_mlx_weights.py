"""GGUF 4-bit groups and Q8_0 blocks become MLX's affine group formats exactly: the quantized matmul equals the
dense matmul of the torch loader's dequantized weight (to float32 rounding); other formats are dequantized."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

from infer.models.quant import Int4Weight, W8Weight
from infer.runners.mlx.weights import linear


def _check(weight, dense: torch.Tensor, bits: int) -> None:
    lin = linear(weight, mx.float32)
    assert lin.bits == bits
    x = np.random.default_rng(0).normal(size=(5, dense.shape[1])).astype(np.float32)
    got = np.array(lin(mx.array(x)))
    ref = x @ dense.numpy().T
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    back = np.array(mx.dequantize(lin.weight, lin.scales, lin.biases, group_size=32, bits=bits)) if bits else None
    if back is not None:
        assert np.abs(back - dense.numpy()).max() < 1e-6


def test_int4_groups_are_kept_4_bit() -> None:
    w = torch.randn(48, 96)
    q = Int4Weight.quantize(w, group_size=32)
    _check(q, q.dequantize(), 4)


def test_q8_0_blocks_are_kept_8_bit() -> None:
    w = torch.randn(40, 64)
    scale = w.view(40, 2, 32).abs().amax(-1) / 127
    q = (w.view(40, 2, 32) / scale[..., None]).round().clamp(-127, 127).to(torch.int8).view(40, 64)
    q8 = W8Weight(q, scale, (1, 32))
    _check(q8, q8.dequantize(), 8)


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_other_8_bit_layouts_are_dequantized(fmt: str) -> None:
    """Per-row int8 scales (groups MLX cannot hold) and FP8 values: dense, equal to the dequantized weight."""
    q = W8Weight.quantize(torch.randn(16, 256), fmt)
    _check(q, q.dequantize(), 0)
