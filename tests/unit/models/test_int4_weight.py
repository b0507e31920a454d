"""Int4Weight: round-to-nearest group quantization stays within half a step of the weight, and its layout is the
one `lz.linear_int4` reads (the layer's matmul through it equals the float matmul with the dequantized weight)."""

from __future__ import annotations

import numpy as np
import torch

from infer.models.quant import Int4Weight, LinearSite


def test_quantize_is_within_half_a_step_and_round_trips() -> None:
    w = torch.randn(40, 128, generator=torch.Generator().manual_seed(0))
    q = Int4Weight.quantize(w, group_size=32)
    assert q.shape == (40, 128) and q.qweight.dtype == torch.uint8
    step = q.scales_zeros[..., 0].transpose(0, 1).repeat_interleave(32, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    again = Int4Weight.quantize(q.dequantize(), group_size=32)  # values on the grid quantize to themselves
    assert torch.allclose(again.dequantize(), q.dequantize(), atol=1e-5)


def test_from_groups_and_linear_match_the_float_weight() -> None:
    rng = np.random.default_rng(1)
    qv = rng.integers(0, 16, size=(24, 64)).astype(np.uint8)
    scale = rng.random((24, 2)).astype(np.float32) * 0.1
    zero = rng.normal(size=(24, 2)).astype(np.float32) * 0.1
    weight = Int4Weight.from_groups(qv, scale, zero, 32, torch.device("cpu"))
    dense = (torch.from_numpy(qv).float() - 8) * torch.from_numpy(scale).repeat_interleave(32, 1) \
        + torch.from_numpy(zero).repeat_interleave(32, 1)
    assert torch.allclose(weight.dequantize(), dense)
    x = torch.randn(3, 64)
    want = x.to(torch.bfloat16).float() @ weight.dequantize().to(torch.bfloat16).float().T  # the kernel's bf16 inputs
    assert torch.allclose(LinearSite()(x, weight), want, atol=2e-2, rtol=2e-2)
