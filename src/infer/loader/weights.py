"""Copy checkpoint tensors into a model through its weight map, with explicit missing/unexpected checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from infer.loader.gguf_quant import GROUP, Int4Groups, dequantize_groups
from infer.models.layers import WeightMap, WeightSlot
from infer.models.quant import Int4Weight, replace_weight

# Tensors some checkpoints carry that the model recomputes or does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A checkpoint that does not fit the model; the message names the tensors."""


def _target(param: torch.Tensor, slot: WeightSlot) -> torch.Tensor:
    """The part of `param` a checkpoint tensor fills: all of it, or its row range in a fused parameter."""
    return param.data if slot.rows is None else param.data.narrow(0, slot.start, slot.rows)


def load_weights(
    model: nn.Module, weight_map: WeightMap, tensors: Iterable[tuple[str, torch.Tensor | Int4Groups]], tied_lm_head: bool,
    int4_params: Iterable[str] = (),
) -> None:
    """Fill every mapped parameter exactly once; fail naming any missing, unexpected or misshapen tensor.

    A tensor may come as 4-bit groups (GGUF Q4_*). A parameter in `int4_params` whose every piece comes so is
    kept 4-bit (an `Int4Weight` in its place); any other gets the pieces dequantized.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    keep = set(int4_params)
    pieces = Counter(slot.param for slot in weight_map.values())
    groups: dict[str, list[tuple[WeightSlot, str, Int4Groups]]] = {}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in tensors:
        slot = weight_map.get(name)
        if slot is None:
            if name.endswith(IGNORED_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
                continue
            unexpected.append(name)
            continue
        param = params[slot.param]
        target = _target(param, slot)
        shape = tensor.q.shape if isinstance(tensor, Int4Groups) else tensor.shape
        if target.shape != shape:
            raise WeightLoadError(f"tensor {name!r} has shape {tuple(shape)}, model expects {tuple(target.shape)}")
        if name in loaded:
            raise WeightLoadError(f"tensor {name!r} appears twice in the checkpoint")
        if isinstance(tensor, Int4Groups):
            groups.setdefault(slot.param, []).append((slot, name, tensor))
        else:
            target.copy_(tensor)
        loaded.add(name)
    if unexpected:
        raise WeightLoadError(f"unexpected tensors in checkpoint: {', '.join(sorted(unexpected)[:20])}")
    missing = sorted(set(weight_map) - loaded)
    if missing:
        raise WeightLoadError(f"missing tensors in checkpoint: {', '.join(missing[:20])}")
    for param_name, parts in groups.items():
        param = params[param_name]
        if param_name in keep and len(parts) == pieces[param_name]:
            parts.sort(key=lambda part: part[0].start)
            q, scale, zero = (np.concatenate([part[2][i] for part in parts]) for i in range(3))
            replace_weight(model, param_name, Int4Weight.from_groups(q, scale, zero, GROUP, param.device))
            continue
        for slot, _, part in parts:  # not kept 4-bit: dequantized like any other tensor
            _target(param, slot).copy_(torch.from_numpy(dequantize_groups(part)))
