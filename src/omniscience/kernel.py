"""The probe read-out: out[t, j] = act_j(h[t] . weight[:, j] + bias[j]) in float32, one launch per layer.

On CUDA a Triton kernel reads the residual in its own dtype, accumulates in float32 (IEEE, not TF32) and
applies each column's activation before its one write, so a probed layer costs one kernel inside the forward
(and inside a captured graph). Elsewhere the same arithmetic runs as torch ops. Activation codes are per column.

Decode has a few rows: one program would walk the whole hidden size alone, latency-bound (~13 us on an H100
for 2048 x 16 float32 weights). There the hidden size is split over programs (split-K): each adds its partial
sums into a float32 workspace with atomics and takes a ticket; the last to arrive reads the sums (and zeroes
the workspace and its ticket for the next call), adds the bias, applies the activation and writes the scores.
The workspace and tickets are zero between calls, so the kernel stays graph-capturable (docs/omniscience.md).
"""

from __future__ import annotations

import torch

ACTIVATION_CODES = {"linear": 0, "sigmoid": 1, "tanh": 2}

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with torch on Linux
    triton = None


def activate(z: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Each column's activation: 0 linear, 1 sigmoid, 2 tanh."""
    return torch.where(codes == 1, torch.sigmoid(z), torch.where(codes == 2, torch.tanh(z), z))


def reference_scores(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The torch form of the read-out (float32): used off CUDA, and what the kernel is tested against."""
    return activate(torch.addmm(bias, h.to(torch.float32), weight), codes)


SPLIT_ROWS = 64  # at most this many rows take the split-K kernel (decode steps); the workspace's height
SPLIT_BLOCK_H = 128  # hidden columns per split-K program


def workspace(columns: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial sums [SPLIT_ROWS, columns] float32, tickets) for the split-K kernel; zero between calls."""
    tickets = (SPLIT_ROWS // 16) * -(-columns // 16)
    return torch.zeros(SPLIT_ROWS, columns, device=device), torch.zeros(tickets, dtype=torch.int32, device=device)


def probe_scores(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor, out: torch.Tensor,
                 scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Write the scores of h [T, hidden] for weight [hidden, P] into out [T, P] (a view; any row stride)."""
    if h.is_cuda and triton is not None:
        if scratch is not None and h.shape[0] <= SPLIT_ROWS:
            launch_split_kernel(h, weight, bias, codes, out, *scratch)
        else:
            launch_kernel(h, weight, bias, codes, out)
    else:
        out.copy_(reference_scores(h, weight, bias, codes))


def launch_split_kernel(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor,
                        out: torch.Tensor, partial: torch.Tensor, tickets: torch.Tensor) -> None:
    rows, hidden = h.shape
    probes = weight.shape[1]
    splits = triton.cdiv(hidden, SPLIT_BLOCK_H)
    grid = (triton.cdiv(rows, 16), triton.cdiv(probes, 16), splits)
    _split_kernel[grid](
        h, weight, bias, codes, out, partial, tickets, rows, h.stride(0), weight.stride(0), out.stride(0),
        partial.stride(0), HIDDEN=hidden, PROBES=probes, SPLITS=splits, BLOCK_H=SPLIT_BLOCK_H, num_warps=4,
    )


def launch_kernel(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor, out: torch.Tensor) -> None:
    """One program per 16 rows and 16-64 probes, walking the hidden size in steps of 256 (tuned on an H100)."""
    rows, hidden = h.shape
    probes = weight.shape[1]
    block_p = min(64, max(16, triton.next_power_of_2(probes)))
    grid = (triton.cdiv(rows, 16), triton.cdiv(probes, block_p))
    _probe_kernel[grid](
        h, weight, bias, codes, out, rows, h.stride(0), weight.stride(0), out.stride(0),
        HIDDEN=hidden, PROBES=probes, BLOCK_T=16, BLOCK_P=block_p, BLOCK_H=256, num_warps=4, num_stages=3,
    )


if triton is not None:

    @triton.jit
    def _probe_kernel(h_ptr, w_ptr, b_ptr, code_ptr, out_ptr, rows, stride_h, stride_w, stride_out,
                      HIDDEN: tl.constexpr, PROBES: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr,
                      BLOCK_H: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        t_ok = t < rows
        p_ok = p < PROBES
        acc = tl.full((BLOCK_T, BLOCK_P), 0.0, tl.float32)  # tl.full, not tl.zeros: the latter is a jit helper the interpreter cannot call
        for k0 in range(0, HIDDEN, BLOCK_H):  # HIDDEN is a constexpr: a plain Python range
            k = k0 + tl.arange(0, BLOCK_H)
            k_ok = k < HIDDEN
            h = tl.load(h_ptr + t[:, None] * stride_h + k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + k[:, None] * stride_w + p[None, :], mask=k_ok[:, None] & p_ok[None, :], other=0.0)
            acc += tl.dot(h.to(tl.float32), w, input_precision="ieee")
        z = acc + tl.load(b_ptr + p, mask=p_ok, other=0.0)[None, :]
        code = tl.load(code_ptr + p, mask=p_ok, other=0)[None, :]
        sigmoid = 1.0 / (1.0 + tl.exp(-z))
        tanh = 2.0 / (1.0 + tl.exp(-2.0 * z)) - 1.0
        score = tl.where(code == 1, sigmoid, tl.where(code == 2, tanh, z))
        tl.store(out_ptr + t[:, None] * stride_out + p[None, :], score, mask=t_ok[:, None] & p_ok[None, :])

    @triton.jit
    def _split_kernel(h_ptr, w_ptr, b_ptr, code_ptr, out_ptr, part_ptr, ticket_ptr, rows, stride_h, stride_w,
                      stride_out, stride_part, HIDDEN: tl.constexpr, PROBES: tl.constexpr, SPLITS: tl.constexpr,
                      BLOCK_H: tl.constexpr):
        pid_t, pid_p = tl.program_id(0), tl.program_id(1)
        t = pid_t * 16 + tl.arange(0, 16)
        p = pid_p * 16 + tl.arange(0, 16)
        k = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        t_ok, p_ok, k_ok = t < rows, p < PROBES, k < HIDDEN
        h = tl.load(h_ptr + t[:, None] * stride_h + k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + k[:, None] * stride_w + p[None, :], mask=k_ok[:, None] & p_ok[None, :], other=0.0)
        partial = tl.dot(h.to(tl.float32), w, input_precision="ieee")
        cell = part_ptr + t[:, None] * stride_part + p[None, :]
        tile_ok = t_ok[:, None] & p_ok[None, :]
        tl.atomic_add(cell, partial, mask=tile_ok, sem="relaxed")
        ticket = ticket_ptr + pid_t * tl.num_programs(1) + pid_p
        if tl.atomic_add(ticket, 1, sem="acq_rel") == SPLITS - 1:  # the last program of this tile
            zero = tl.full((16, 16), 0.0, tl.float32)
            z = tl.atomic_add(cell, zero, mask=tile_ok, sem="acquire")  # read the sums coherently
            tl.store(cell, zero, mask=tile_ok)  # every other program of the tile is done with it
            z += tl.load(b_ptr + p, mask=p_ok, other=0.0)[None, :]
            code = tl.load(code_ptr + p, mask=p_ok, other=0)[None, :]
            sigmoid = 1.0 / (1.0 + tl.exp(-z))
            tanh = 2.0 / (1.0 + tl.exp(-2.0 * z)) - 1.0
            score = tl.where(code == 1, sigmoid, tl.where(code == 2, tanh, z))
            tl.store(out_ptr + t[:, None] * stride_out + p[None, :], score, mask=tile_ok)
            tl.store(ticket, 0)
