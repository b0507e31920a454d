"""The attention prologue as one op: optional QK-norm, RoPE on the q and k heads of a fused QKV output, K/V store;
optionally the QKV projection itself (`proj`: the op is given x and the weight, not their product).

The reference composes F.linear (in x's dtype) and the reference norm, rope and store, so it is exactly that
sequence.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from layerzero.kernels.reference import kv_cache, norm
from layerzero.kernels.reference import rope as rope_ref


def split_heads(
    qkv: torch.Tensor, key_cache: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views (q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]) of qkv [T, H + 2*Hkv, D], checked against the cache."""
    if qkv.dim() != 3:
        raise ValueError(f"rope_store_kv expects qkv [T, H + 2*Hkv, D], got shape {tuple(qkv.shape)}")
    kv_heads = key_cache.shape[2]
    if qkv.shape[1] != num_heads + 2 * kv_heads or key_cache.shape[3] != qkv.shape[2]:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not hold {num_heads} q heads and 2 x {kv_heads} kv heads "
                         f"of the cache {tuple(key_cache.shape)}")
    return qkv[:, :num_heads], qkv[:, num_heads : num_heads + kv_heads], qkv[:, num_heads + kv_heads :]


def check_projection(x: torch.Tensor, proj: torch.Tensor, key_cache: torch.Tensor) -> int:
    """The heads proj [N, K] makes of x [T, K] (N / D, D the cache's head dim); ValueError if they do not fit."""
    head_dim = key_cache.shape[3]
    if x.dim() != 2 or proj.dim() != 2 or proj.shape[1] != x.shape[1] or proj.shape[0] % head_dim:
        raise ValueError(f"rope_store_kv with proj expects x [T, K] and proj [N, K] with N a multiple of the head "
                         f"dim {head_dim}; got {tuple(x.shape)} and {tuple(proj.shape)}")
    return proj.shape[0] // head_dim


def projected(qkv: torch.Tensor, proj: torch.Tensor | None, key_cache: torch.Tensor,
              linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """qkv as given, or with `proj` [N, K] the heads [T, N / D, D] of linear(x [T, K], proj) (D: the cache's;
    `linear`: layerzero's own op by default, the kernels' way to project before their prologue)."""
    if proj is None:
        return qkv
    if linear is None:
        import layerzero.api as lz  # late: the api's dispatch loads the kernels that call this

        linear = lz.linear
    heads = check_projection(qkv, proj, key_cache)
    return linear(qkv, proj).view(qkv.shape[0], heads, key_cache.shape[3])


def rope_store_kv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
    proj: torch.Tensor | None = None, *, num_heads: int, eps: float, weight_offset: float, interleaved: bool,
) -> torch.Tensor:
    """Project (with `proj`), norm (when weights are given) and rotate q and k, store k and v at their slots;
    returns the rotated q."""
    qkv = projected(qkv, proj, key_cache, F.linear)
    q, k, v = split_heads(qkv, key_cache, num_heads)
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("rope_store_kv takes both QK-norm weights or neither")
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = norm.rms_norm(q, q_norm_weight, eps, weight_offset), norm.rms_norm(k, k_norm_weight, eps, weight_offset)
    q, k = rope_ref.rope(q, cos, sin, interleaved), rope_ref.rope(k, cos, sin, interleaved)
    kv_cache.store_kv_cache(k, v, key_cache, value_cache, slot_mapping)
    return q.contiguous()
