"""Triton SiLU-and-mul and GeLU-and-mul (interpreted) against the PyTorch reference.

The kernels compute in float32 and round once. In float16/bfloat16 the reference rounds act(gate)
before the product, an error of its own as large as the tolerance; so the expected values are the
reference evaluated in float32 on the same inputs, rounded once to the input dtype.
"""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import activation as ref


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("activation")


def _x(rng: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    # I = 1152 (Gemma-3-1B): two column blocks, the second one partial; large |x| tails included
    return (torch.randn(1, 2, 2 * 1152, generator=rng) * 4.0).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_and_mul_matches_reference(kernels, rng, assert_matches, dtype):
    x = _x(rng, dtype)
    assert_matches(kernels.silu_and_mul(x), ref.silu_and_mul(x.float()).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_and_mul_matches_reference(kernels, rng, assert_matches, dtype, approximate):
    x = _x(rng, dtype)
    assert_matches(kernels.gelu_and_mul(x, approximate=approximate), ref.gelu_and_mul(x.float(), approximate).to(dtype))


def test_extreme_gates_stay_finite(kernels):
    x = torch.tensor([[-1e4, 1e4, 0.0, 3.0, 2.0, -2.0]])
    for out in (kernels.silu_and_mul(x), kernels.gelu_and_mul(x, approximate="tanh")):
        torch.testing.assert_close(out, torch.tensor([[-0.0, 2e4, 0.0]]), atol=1e-5, rtol=1e-5)


def test_odd_width_is_rejected(kernels):
    with pytest.raises(ValueError, match="even"):
        kernels.silu_and_mul(torch.randn(2, 5))
