"""The Triton argmax compiled on CUDA at Llama-3's vocabulary: equal to torch.argmax (ties, -inf rows, sparse rows,
NaN), chosen by `lz.argmax`, launched without host syncs and replayed in a CUDA graph with new logits."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference import argmax as ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

pytest.importorskip("triton")
from layerzero.kernels.triton import argmax  # noqa: E402

VOCAB = 128256  # Llama-3's


def _logits(rows: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random logits (a slice of a wider buffer) with, past the first rows, a tie across blocks, a tie in one block,
    an all -inf row, a few finite values among -inf and a NaN after a +inf."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, VOCAB + 64, device="cuda", generator=g).to(dtype)[:, :VOCAB]
    if rows > 8:
        x[1, [5000, 127000]] = 60.0
        x[2, [8200, 8201]] = 60.0
        x[3] = -float("inf")
        x[4] = -float("inf")
        x[4, [17, 90000, 128255]] = torch.tensor([0.5, 2.0, 2.0], dtype=dtype, device="cuda")
        x[5, 100], x[5, 70000] = float("inf"), float("nan")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [256, 1])
def test_triton_argmax_equals_torch(rows, dtype):
    for seed in range(3):
        x = _logits(rows, dtype, seed)
        want = x.argmax(dim=-1)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = argmax.argmax(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert got.dtype == torch.int64 and torch.equal(got, want), f"seed {seed}"
        assert torch.equal(ref.argmax(x), want), f"seed {seed}"


def test_lz_argmax_selects_triton_on_cuda():
    x = _logits(256, torch.bfloat16, 7)
    assert lz.which("argmax", x)["kernel_id"] == "triton.argmax"
    assert torch.equal(lz.argmax(x), x.argmax(dim=-1))


def test_argmax_replays_in_a_cuda_graph():
    x = _logits(256, torch.float32, 11)
    argmax.argmax(x)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax.argmax(x)
    x.copy_(_logits(256, torch.float32, 12))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x.argmax(dim=-1))
