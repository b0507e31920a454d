"""The probe read-out: out[t, j] = act_j(h[t] . weight[:, j] + bias[j]) in float32, one launch per layer.

On CUDA a Triton kernel reads the residual in its own dtype, accumulates in float32 (IEEE, not TF32) and
applies each column's activation before its one write, so a probed layer costs one kernel inside the forward
(and inside a captured graph). Elsewhere the same arithmetic runs as torch ops. Activation codes are per column.
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


def probe_scores(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor, out: torch.Tensor) -> None:
    """Write the scores of h [T, hidden] for weight [hidden, P] into out [T, P] (a view; any row stride)."""
    if h.is_cuda and triton is not None:
        launch_kernel(h, weight, bias, codes, out)
    else:
        out.copy_(reference_scores(h, weight, bias, codes))


def launch_kernel(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor, out: torch.Tensor) -> None:
    rows, hidden = h.shape
    probes = weight.shape[1]
    block_t = 16 if rows <= 16 else 64
    block_p = min(64, max(16, triton.next_power_of_2(probes)))
    grid = (triton.cdiv(rows, block_t), triton.cdiv(probes, block_p))
    _probe_kernel[grid](
        h, weight, bias, codes, out, rows, h.stride(0), weight.stride(0), out.stride(0),
        HIDDEN=hidden, PROBES=probes, BLOCK_T=block_t, BLOCK_P=block_p, BLOCK_H=64,
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
