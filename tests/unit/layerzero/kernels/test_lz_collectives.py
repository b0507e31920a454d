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


def _fold_rank(rank: int, port: int, queue: object) -> None:
    """One gloo rank: lz.all_reduce_add_rms_norm with `proj` against projecting, summing, adding and norming by hand."""
    import torch.distributed as dist

    import layerzero as lz

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        gen = torch.Generator().manual_seed(10 + rank)  # this rank's input and shard
        x, proj = torch.randn(3, 24, generator=gen), torch.randn(16, 24, generator=gen)
        shared = torch.Generator().manual_seed(3)
        residual, weight = torch.randn(3, 16, generator=shared), torch.rand(16, generator=shared)
        normed, summed = lz.all_reduce_add_rms_norm(x, residual, weight, dist.group.WORLD, eps=1e-6, proj=proj)
        partial = x @ proj.T
        dist.all_reduce(partial)
        want = partial + residual
        torch.testing.assert_close(summed, want)
        torch.testing.assert_close(normed, want * torch.rsqrt(want.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
        queue.put((rank, "ok"))  # type: ignore[attr-defined]
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put((rank, f"{type(exc).__name__}: {exc}"))  # type: ignore[attr-defined]


def test_reduce_add_norm_with_its_projection_on_gloo():
    """With `proj`, x is the projection's input: each rank's linear(x, proj) is the partial summed over the ranks."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fold_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == {0: "ok", 1: "ok"}, results
