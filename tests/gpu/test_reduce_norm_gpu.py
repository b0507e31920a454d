"""The one-kernel all-reduce + residual add + RMSNorm over symmetric memory (a group of one on one GPU, of two, and
of every GPU where there are more): against a float64 reference of the sum, the add and the norm, the same bits on
every rank, eagerly and replayed in a CUDA graph with fresh inputs, calls of different row counts interleaved (each
row keeps its own phase), a partial holding the buffers' empty mark (every bit set); the group's setup on the first
call makes no host sync (a step may be the first caller); with the layer's projection folded in, the bits of the
plain kernel over the projection's output."""

from __future__ import annotations

import multiprocessing
import os
import socket

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 1, reason="the symmetric-memory kernel runs on CUDA devices")

CASES = [(1, 4096, torch.bfloat16), (7, 4096, torch.bfloat16), (32, 4096, torch.bfloat16), (5, 1000, torch.float32),
         (3, 64, torch.float16), (1, 2048, torch.bfloat16)]


def _expected(parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, offset: float,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """parts [world, T, H]: the sum rounded to their dtype, + residual rounded to the stream's, normed in float64."""
    reduced = parts.double().sum(0).to(parts.dtype).double()
    summed = (reduced + residual.double()).to(residual.dtype)
    s = summed.double()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (weight.double() + offset)
    return normed, summed


def _check(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor],
           group: object, world: int, offset: float, eps: float) -> None:
    import torch.distributed as dist

    parts = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(parts, x, group=group)
    normed, summed = _expected(parts, residual, weight, offset, eps)
    exact = world == 2 or x.dtype != torch.float32  # more float32 partials: float32 sums round between the adds
    torch.testing.assert_close(out[1], summed, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)
    tol = 2e-2 if x.dtype != torch.float32 else 1e-5
    torch.testing.assert_close(out[0].double(), normed, rtol=tol, atol=tol)
    mine = torch.cat([out[0].float().flatten(), out[1].float().flatten()])
    every = torch.empty((world, mine.numel()), dtype=mine.dtype, device=mine.device)
    dist.all_gather_into_tensor(every, mine, group=group)
    assert bool((every == every[0]).all()), "the ranks disagree"


def _rank(rank: int, world: int, port: int, queue: multiprocessing.Queue) -> None:
    try:
        import torch.distributed as dist

        from layerzero.kernels.triton import reduce_norm

        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        group = dist.group.WORLD
        gen = torch.Generator(device="cuda").manual_seed(100 + rank)
        shared = torch.Generator(device="cuda").manual_seed(7)  # the residual and the weight: the same on every rank
        eps, offset = 1e-6, 0.0
        for rows, hidden, dtype in CASES * 2:  # twice over: every row's phase flips between calls
            x = torch.randn((rows, hidden), generator=gen, device="cuda").to(dtype)
            residual = torch.randn((rows, hidden), generator=shared, device="cuda").to(dtype)
            weight = torch.rand(hidden, generator=shared, device="cuda").to(dtype)
            torch.cuda.set_sync_debug_mode("error")  # the first call sets the group up: with no host sync either
            out = reduce_norm.all_reduce_add_rms_norm(x, residual, weight, eps=eps, weight_offset=offset, group=group)
            torch.cuda.set_sync_debug_mode("default")
            _check(x, residual, weight, out, group, world, offset, eps)
        assert reduce_norm._symmetric_rows(group, x.device) is not None, "symmetric memory was not set up"
        # an element whose bits are the empty mark (a NaN) is sent as another NaN: it arrives, nothing waits forever
        x = torch.randn((2, 4096), generator=gen, device="cuda").to(torch.bfloat16)
        x.view(torch.int16)[1, 7] = -1
        residual = torch.randn((2, 4096), generator=shared, device="cuda").to(torch.bfloat16)
        weight = torch.rand(4096, generator=shared, device="cuda").to(torch.bfloat16)
        normed, summed = reduce_norm.all_reduce_add_rms_norm(x, residual, weight, eps=eps, weight_offset=offset,
                                                             group=group)
        assert bool(summed[1, 7].isnan()) and bool(normed[1].isnan().all())
        assert bool(summed[0].isfinite().all()) and bool(summed[1, 8:].isfinite().all())
        for rows, hidden, dtype in CASES:  # every row's next calls as before
            x = torch.randn((rows, hidden), generator=gen, device="cuda").to(dtype)
            residual = torch.randn((rows, hidden), generator=shared, device="cuda").to(dtype)
            weight = torch.rand(hidden, generator=shared, device="cuda").to(dtype)
            out = reduce_norm.all_reduce_add_rms_norm(x, residual, weight, eps=eps, weight_offset=offset, group=group)
            _check(x, residual, weight, out, group, world, offset, eps)
        # a graph of three calls (8 rows, 1 row, 8 rows), replayed with fresh inputs
        hidden, dtype = 4096, torch.bfloat16
        xs = [torch.zeros((r, hidden), dtype=dtype, device="cuda") for r in (8, 1, 8)]
        rs = [torch.zeros_like(t) for t in xs]
        weight = torch.rand(hidden, generator=shared, device="cuda").to(dtype)
        for _ in range(2):  # warm (compiles) outside the capture
            outs = [reduce_norm.all_reduce_add_rms_norm(a, b, weight, eps=eps, weight_offset=1.0, group=group)
                    for a, b in zip(xs, rs)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [reduce_norm.all_reduce_add_rms_norm(a, b, weight, eps=eps, weight_offset=1.0, group=group)
                    for a, b in zip(xs, rs)]
        for _ in range(5):
            for a, b in zip(xs, rs):
                a.copy_(torch.randn(a.shape, generator=gen, device="cuda"))
                b.copy_(torch.randn(b.shape, generator=shared, device="cuda"))
            graph.replay()
            for a, b, out in zip(xs, rs, outs):
                _check(a, b, weight, out, group, world, 1.0, eps)
        _check_folded(gen, shared, group, world)
        torch.cuda.synchronize()
        queue.put((rank, "ok"))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    queue.close()
    queue.join_thread()
    os._exit(0)  # no NCCL teardown (it can wait on a peer that has gone)


def _check_folded(gen: torch.Generator, shared: torch.Generator, group: object, world: int) -> None:
    """The projection folded in (`all_reduce_add_rms_norm_splitk`: the split-K GEMV's slices summed inside the reduce
    kernel) gives the bits of the plain kernel over the slices summed as the sum kernel does, on Llama-3.1-8B's O
    (K 2048) and down (K 7168) shards at TP=2 and 1-8 rows, eagerly and replayed in a graph with fresh inputs."""
    from layerzero.kernels.triton import gemv, reduce_norm
    from layerzero.kernels.triton.specs import FUSED_SPLITK_TILE

    def plain(x: torch.Tensor, proj: torch.Tensor, residual: torch.Tensor,
              weight: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        slices = gemv.splitk_partials(x, proj, FUSED_SPLITK_TILE)
        y = slices[0]
        for part in slices[1:]:  # slice order, as gemv.summed_slices
            y = y + part
        y = y.to(x.dtype)
        return reduce_norm.all_reduce_add_rms_norm(y, residual, weight, eps=1e-6, weight_offset=0.0, group=group), y

    def same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), "the fold changed the bits"

    dtype = torch.bfloat16
    for rows, k in ((1, 2048), (3, 7168), (8, 2048)):
        x = (torch.randn((rows, k), generator=gen, device="cuda") * k**-0.5).to(dtype)
        proj = torch.randn((4096, k), generator=gen, device="cuda").to(dtype)
        residual = torch.randn((rows, 4096), generator=shared, device="cuda").to(dtype)
        weight = torch.rand(4096, generator=shared, device="cuda").to(dtype)
        folded = reduce_norm.all_reduce_add_rms_norm_splitk(x, residual, weight, proj, eps=1e-6, weight_offset=0.0,
                                                            group=group)
        want, y = plain(x, proj, residual, weight)
        same(folded, want)
        _check(y, residual, weight, folded, group, world, 0.0, 1e-6)
    x, residual = torch.zeros((2, 2048), dtype=dtype, device="cuda"), torch.zeros((2, 4096), dtype=dtype, device="cuda")
    proj = torch.randn((4096, 2048), generator=gen, device="cuda").to(dtype)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = reduce_norm.all_reduce_add_rms_norm_splitk(x, residual, weight, proj, eps=1e-6, weight_offset=0.0,
                                                         group=group)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, generator=gen, device="cuda") * 2048**-0.5)
        residual.copy_(torch.randn(residual.shape, generator=shared, device="cuda"))
        graph.replay()
        same(out, plain(x, proj, residual, weight)[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", sorted({1, min(GPUS, 2), GPUS}) if GPUS else [1])
def test_reduce_add_norm_matches_float64_on_every_rank(world):
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert results == {r: "ok" for r in range(world)}, results
