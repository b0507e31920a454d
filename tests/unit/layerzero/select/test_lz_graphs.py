"""CUDA-graph safety: capture detection never raises, unknown kernels are unsafe, strict mode needs a dummy capture."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import norm
from layerzero.select import graphs
from layerzero.select.capture import is_capturing
from layerzero.select.context import SelectionContext
from layerzero.select.graphs import graph_safety_reason, validate_capture, verify
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CUDA_GRAPH_UNSAFE

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _spec(graph_safe: bool, impl=None) -> KernelSpec:
    impl = impl or (lambda x, w, *, eps, weight_offset: norm.rms_norm(x, w, eps, weight_offset))
    return KernelSpec(kernel_id=f"test.rms.{graph_safe}", op="rms_norm", backend="test", impl=impl, graph_safe=graph_safe)


@pytest.fixture(autouse=True)
def _fresh_verifications():
    graphs.clear_verified()
    yield
    graphs.clear_verified()


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), "cuda", 0, "meta"])
def test_is_capturing_false_outside_capture_and_never_raises(device) -> None:
    assert is_capturing(device) is False


def test_graph_safety_reason_outside_capture_is_none() -> None:
    ctx = SelectionContext(op="rms_norm", capturing=False)
    assert graph_safety_reason(_spec(False), ctx, strict=True) is None


def test_undeclared_kernels_are_unsafe_while_capturing() -> None:
    ctx = SelectionContext(op="rms_norm", device="cuda:0", platform="cuda", capturing=True)
    reason = graph_safety_reason(_spec(False), ctx)
    assert reason is not None and reason.code == CUDA_GRAPH_UNSAFE and "declared" in reason.message
    assert graph_safety_reason(_spec(True), ctx) is None


def test_strict_mode_requires_verification_for_the_shape() -> None:
    x, w = torch.randn(4, 8), torch.ones(8)
    spec = _spec(True)
    ctx = SelectionContext.from_tensors("rms_norm", x, w, eps=1e-6, weight_offset=0.0).with_(capturing=True)
    missing = graph_safety_reason(spec, ctx, strict=True)
    assert missing is not None and "not verified" in missing.message
    # on CPU the dummy capture cannot run: the recorded outcome is a CUDA_GRAPH_UNSAFE reason, not a pass
    recorded = verify(spec, x, w, eps=1e-6, weight_offset=0.0)
    assert recorded is not None and recorded.code == CUDA_GRAPH_UNSAFE
    assert graph_safety_reason(spec, ctx, strict=True) == recorded


def test_validate_capture_without_cuda_tensors_is_a_reason() -> None:
    reason = validate_capture(torch.add, torch.ones(2), torch.ones(2))
    assert reason is not None and reason.code == CUDA_GRAPH_UNSAFE


@cuda
def test_is_capturing_inside_a_capture() -> None:
    x = torch.ones(8, device="cuda")
    seen = []
    g = torch.cuda.CUDAGraph()
    x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        seen.append((is_capturing(), is_capturing("cuda"), is_capturing(x.device), is_capturing("cpu")))
        x.add_(1)
    assert seen == [(True, True, True, False)] and is_capturing() is False


@cuda
def test_validate_capture_accepts_safe_and_rejects_syncing_kernels() -> None:
    x, w = torch.randn(16, 64, device="cuda"), torch.randn(64, device="cuda")
    assert validate_capture(norm.rms_norm, x, w, 1e-6, 0.0) is None

    def syncs(t: torch.Tensor) -> torch.Tensor:
        return t * float(t.sum().item())  # host read-back: illegal inside a capture

    reason = validate_capture(syncs, x)
    assert reason is not None and reason.code == CUDA_GRAPH_UNSAFE and "capture" in reason.message
    assert validate_capture(norm.rms_norm, x, w, 1e-6, 0.0) is None  # a failed capture leaves the device usable


@cuda
def test_strict_mode_passes_after_successful_verification() -> None:
    x, w = torch.randn(4, 64, device="cuda"), torch.ones(64, device="cuda")
    spec = _spec(True)
    assert verify(spec, x, w, eps=1e-6, weight_offset=0.0) is None
    ctx = SelectionContext.from_tensors("rms_norm", x, w, eps=1e-6, weight_offset=0.0).with_(capturing=True)
    assert graph_safety_reason(spec, ctx, strict=True) is None
    other = SelectionContext.from_tensors("rms_norm", x.half(), w.half(), eps=1e-6, weight_offset=0.0).with_(capturing=True)
    assert graph_safety_reason(spec, other, strict=True) is not None  # another dtype was never verified


@cuda
def test_lz_ops_capture_and_replay_in_a_cuda_graph() -> None:
    """Inside a capture, dispatch sees capturing=True and picks graph-safe kernels; replay follows new inputs."""
    import layerzero as lz

    x, w = torch.randn(8, 128, device="cuda"), torch.randn(128, device="cuda")
    lz.silu_and_mul(lz.rms_norm(x, w))  # warm: selection, JIT
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = lz.silu_and_mul(lz.rms_norm(x, w))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    want = torch.nn.functional.silu(norm.rms_norm(x, w, 1e-6, 0.0)[:, :64]) * norm.rms_norm(x, w, 1e-6, 0.0)[:, 64:]
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
