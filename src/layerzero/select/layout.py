"""Attention layout resolution (docs/layerzero.md, "Layout"): explicit `layout=`, else shapes, else strides, else an error.

Shapes decide when only one of BSHD/BHSD is consistent across q, k, v (GQA head ratio, decode with one
query). Strides decide when q, k, v are all views with dims 1 and 2 swapped against memory order: a
projection writes tokens-major memory [B, S, H, D], so such a view is BHSD. Anything else is ambiguous.
"""

from __future__ import annotations

import torch

from layerzero.select.errors import LayoutError

LAYOUTS = ("BSHD", "BHSD")


def _consistent(layout: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether q, k, v shapes make sense read as `layout` (same batch, heads divisible, k and v alike)."""
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return False
    if ks[:3] != vs[:3] or qs[0] != ks[0] or qs[3] != ks[3]:
        return False
    h = 2 if layout == "BSHD" else 1
    return ks[h] > 0 and qs[h] % ks[h] == 0


def _transposed_view(t: torch.Tensor) -> bool:
    return t.shape[1] > 1 and t.shape[2] > 1 and t.stride(1) < t.stride(2)


def resolve_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str | None) -> str:
    """The layout of a dense attention call; raises LayoutError when invalid or ambiguous."""
    if layout is not None:
        if layout not in LAYOUTS:
            raise LayoutError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not _consistent(layout, q, k, v):
            raise LayoutError(
                f"shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} are not a valid {layout} attention call"
            )
        return layout
    fits = [name for name in LAYOUTS if _consistent(name, q, k, v)]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise LayoutError(f"shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} fit neither BSHD nor BHSD")
    if all(_transposed_view(t) for t in (q, k, v)):
        return "BHSD"
    raise LayoutError(
        f"ambiguous attention layout for q{tuple(q.shape)} k{tuple(k.shape)}: both BSHD and BHSD fit the shapes "
        "and the strides do not tell; pass layout='BSHD' or layout='BHSD'"
    )
