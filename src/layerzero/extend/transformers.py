"""transformers integration: `register()` makes `attn_implementation="layerzero"` route attention through lz.

transformers builds one mask per forward (per mask type) through the mask interface and passes it to every
attention call. The layerzero mask function materializes transformers' own boolean mask once and proves it
equals padding + (causal, sliding-window) structure that lz can run: per sequence, the valid queries are the
last of its valid keys. Such a mask becomes a `LayerZeroMask`; anything else (chunked, bidirectional image
blocks, packed sequences) raises NotImplementedError rather than computing something different.
Unpadded batches go to `lz.attention`; padded ones are packed and go to `lz.varlen_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, prepare_padding_mask, sdpa_mask

import layerzero as lz

NAME = "layerzero"


@dataclass(frozen=True)
class Packing:
    """Where the real (non-padding) rows of a padded batch are, as varlen attention takes them."""

    rows_q: torch.Tensor  # flat indices into [B * Q] of the valid queries
    rows_k: torch.Tensor  # flat indices into [B * K] of the valid keys
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor
    host_q: list[int]  # host copies of the cu_seqlens
    host_k: list[int]

    @classmethod
    def of(cls, valid_q: torch.Tensor, valid_k: torch.Tensor) -> Packing:
        host_q, host_k = [0], [0]
        for nq, nk in zip(valid_q.sum(-1).tolist(), valid_k.sum(-1).tolist(), strict=True):
            host_q.append(host_q[-1] + nq)
            host_k.append(host_k[-1] + nk)
        device = valid_q.device
        return cls(
            valid_q.reshape(-1).nonzero().squeeze(1), valid_k.reshape(-1).nonzero().squeeze(1),
            torch.tensor(host_q, dtype=torch.int32, device=device), torch.tensor(host_k, dtype=torch.int32, device=device),
            host_q, host_k,
        )


@dataclass(frozen=True)
class LayerZeroMask:
    """An attention mask lz can run: causal or not, an optional window, and (padded batches) the packing."""

    causal: bool
    window: int | None
    packing: Packing | None = None


def _implied(valid_q: torch.Tensor, valid_k: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """[B, Q, K] mask of lz semantics on the valid rows: queries are the last n_q of the n_k valid keys."""
    rank_q = (valid_q.cumsum(-1) - 1).unsqueeze(-1)
    rank_k = (valid_k.cumsum(-1) - 1).unsqueeze(-2)
    pos_q = rank_q + (valid_k.sum(-1) - valid_q.sum(-1)).view(-1, 1, 1)  # query position among the valid keys
    allowed = valid_q.unsqueeze(-1) & valid_k.unsqueeze(-2)
    if causal:
        allowed = allowed & (rank_k <= pos_q)
    if window is not None:
        allowed = allowed & (pos_q - rank_k < window)
    return allowed


def analyze(mask: torch.Tensor, window_hint: int | None) -> LayerZeroMask:
    """Express a [B, 1, Q, K] (or [B, Q, K]) keep-mask as a LayerZeroMask, or raise NotImplementedError."""
    keep = mask.squeeze(1) if mask.dim() == 4 else mask
    if keep.dim() != 3:
        raise NotImplementedError(f"layerzero attention takes one mask for all heads; got shape {tuple(mask.shape)}")
    valid_q, valid_k = keep.any(-1), keep.any(-2)
    candidates = dict.fromkeys([(True, window_hint), (True, None), (False, None)])  # ordered, deduplicated
    for causal, window in candidates:
        if torch.equal(_implied(valid_q, valid_k, causal, window), keep):
            dense = bool(valid_q.all()) and bool(valid_k.all())
            return LayerZeroMask(causal, window, None if dense else Packing.of(valid_q, valid_k))
    raise NotImplementedError(
        "layerzero attention runs padding + causal/sliding-window masks only; this model's mask has another "
        "pattern (chunked, bidirectional blocks or packed sequences): use attn_implementation='sdpa' for it"
    )


def layerzero_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    **kwargs: Any,
) -> LayerZeroMask:
    """transformers mask interface: transformers' exact mask, verified and reduced to a LayerZeroMask."""
    for flag in ("allow_is_causal_skip", "allow_is_bidirectional_skip", "allow_torch_fix", "dtype", "config"):
        kwargs.pop(flag, None)
    full = sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False, **kwargs,
    )
    if attention_mask is not None:
        # a padding query's output is never read; dropping its row lets right padding pack like left padding
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        real_q = padding[:, torch.arange(q_length, device=padding.device) + q_offset]
        full = full & real_q[:, None, :, None]
    return analyze(full, local_size)


def _to_keep(mask: torch.Tensor) -> torch.Tensor:
    """A user-supplied 4-D mask as booleans (additive float masks: 0 keeps, the dtype's minimum or -inf drops)."""
    if mask.dtype == torch.bool:
        return mask
    dropped = mask <= torch.finfo(mask.dtype).min / 2
    if not bool(((mask == 0) | dropped).all()):
        raise NotImplementedError("layerzero attention does not take additive attention biases")
    return ~dropped


def layerzero_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: LayerZeroMask | torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: q [B, H, Q, D], k/v [B, Hkv, K, D] -> ([B, Q, H, D], None)."""
    if dropout:
        raise NotImplementedError("layerzero attention has no dropout; use it for inference (model.eval())")
    for unsupported in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"layerzero attention does not support {unsupported}")
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        mask = LayerZeroMask(bool(causal), sliding_window)
    elif isinstance(attention_mask, LayerZeroMask):
        mask = attention_mask
    else:
        mask = analyze(_to_keep(attention_mask), sliding_window)
    if mask.packing is None:
        out = lz.attention(query, key, value, causal=mask.causal, scale=scaling, layout="BHSD",
                           sliding_window=mask.window)
        return out.transpose(1, 2).contiguous(), None
    return _packed(query, key, value, mask, scaling), None


def _packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: LayerZeroMask, scale: float | None) -> torch.Tensor:
    """Pack the valid rows of every sequence, run varlen attention, scatter back (padding rows are zero)."""
    pack = mask.packing
    b, h, q_len, _ = q.shape
    flat_q, flat_k, flat_v = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]) for t in (q, k, v))
    lens_q = [e - s for s, e in zip(pack.host_q, pack.host_q[1:])]
    lens_k = [e - s for s, e in zip(pack.host_k, pack.host_k[1:])]
    out = lz.varlen_attention(
        flat_q[pack.rows_q], flat_k[pack.rows_k], flat_v[pack.rows_k], pack.cu_seqlens_q, pack.cu_seqlens_k,
        max(lens_q), max(lens_k), causal=mask.causal, scale=scale, sliding_window=mask.window,
        cu_seqlens_host=(pack.host_q, pack.host_k),
    )
    full = out.new_zeros(b * q_len, h, v.shape[-1])
    full[pack.rows_q] = out
    return full.view(b, q_len, h, v.shape[-1])


def register(name: str = NAME) -> None:
    """Register the layerzero attention and mask functions with transformers under `name`."""
    AttentionInterface.register(name, layerzero_attention)
    AttentionMaskInterface.register(name, layerzero_mask)
