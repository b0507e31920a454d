"""Copy checkpoint tensors into a model through its weight map, with explicit missing/unexpected checks."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from infer.models.layers import WeightMap

# Tensors some checkpoints carry that the model recomputes or does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A checkpoint that does not fit the model; the message names the tensors."""


def load_weights(
    model: nn.Module, weight_map: WeightMap, tensors: Iterable[tuple[str, torch.Tensor]], tied_lm_head: bool
) -> None:
    """Fill every mapped parameter exactly once; fail naming any missing, unexpected or misshapen tensor."""
    params = dict(model.named_parameters(remove_duplicate=False))
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
        target = param.data if slot.rows is None else param.data.narrow(0, slot.start, slot.rows)
        if target.shape != tensor.shape:
            raise WeightLoadError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)}"
            )
        if name in loaded:
            raise WeightLoadError(f"tensor {name!r} appears twice in the checkpoint")
        target.copy_(tensor)
        loaded.add(name)
    if unexpected:
        raise WeightLoadError(f"unexpected tensors in checkpoint: {', '.join(sorted(unexpected)[:20])}")
    missing = sorted(set(weight_map) - loaded)
    if missing:
        raise WeightLoadError(f"missing tensors in checkpoint: {', '.join(missing[:20])}")
