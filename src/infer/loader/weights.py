"""Copy checkpoint tensors into a model through its weight map, with explicit missing/unexpected checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from infer.loader.gguf_quant import GROUP, Int4Groups
from infer.loader.hf_quant import W8Tensor
from infer.models.layers import WeightMap, WeightSlot
from infer.models.quant import ExpertStack, Int4Experts, Int4Weight, QuantWeight, W8Experts, W8Weight, replace_weight

Packed = Int4Groups | W8Tensor  # a checkpoint tensor that may be kept quantized

# Tensors some checkpoints carry that the model recomputes or does not use.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """A checkpoint that does not fit the model; the message names the tensors."""


def _target(param: torch.Tensor, slot: WeightSlot) -> torch.Tensor:
    """The part of `param` a checkpoint tensor fills: all of it, or its entry of a stacked parameter, and there its
    row range in a fused one."""
    data = param.data if slot.index is None else param.data[slot.index]
    return data if slot.rows is None else data.narrow(0, slot.start, slot.rows)


def _combine(parts: list[tuple[WeightSlot, str, Packed]], device: torch.device) -> QuantWeight | ExpertStack | None:
    """One quantized weight from a parameter's pieces (rows in order; a stack of experts: each expert's rows), or
    None when they do not share a format."""
    if parts[0][0].index is not None:
        return _combine_experts(parts, device)
    packed = [part[2] for part in sorted(parts, key=lambda part: part[0].start)]
    if all(isinstance(p, Int4Groups) for p in packed):
        q, scale, zero = (np.concatenate([p[i] for p in packed]) for i in range(3))
        return Int4Weight.from_groups(q, scale, zero, GROUP, device)
    if not all(isinstance(p, W8Tensor) for p in packed) or len({p.weight.dtype for p in packed}) > 1:
        return None
    combined = _combine_w8(packed)
    return None if combined is None else W8Weight(*(t.to(device) for t in combined[:2]), combined[2])


def _combine_w8(packed: list[W8Tensor]) -> W8Tensor | None:
    """8-bit row pieces as one weight whose scale blocks line up, or None when they cannot."""
    blocks = {p.block_size for p in packed}
    bn, bk = packed[0].block_size
    if len(blocks) == 1 and all(p.weight.shape[0] % bn == 0 for p in packed[:-1]):
        scale = torch.cat([p.scale for p in packed])  # every piece starts on a row block: the blocks line up
    elif len({b[1] for b in blocks}) == 1:
        # row blocks that do not line up (64-row k/v pieces of 128-row blocks, per-tensor pieces): a scale per row
        scale = torch.cat([p.scale.repeat_interleave(p.block_size[0], dim=0)[:p.weight.shape[0]] for p in packed])
        bn = 1
    else:
        return None
    return W8Tensor(torch.cat([p.weight for p in packed]), scale.contiguous(), (bn, bk))


def _combine_experts(parts: list[tuple[WeightSlot, str, Packed]], device: torch.device) -> ExpertStack | None:
    """A stack of experts kept quantized from each expert's pieces (gate and up rows of w13, or w2), or None when
    the experts do not share one format and block."""
    experts: dict[int, list[Packed]] = {}
    for slot, _, packed in sorted(parts, key=lambda part: (part[0].index, part[0].start)):
        experts.setdefault(slot.index, []).append(packed)
    stacks = [experts[e] for e in sorted(experts)]
    if all(isinstance(p, Int4Groups) for pieces in stacks for p in pieces):
        return Int4Experts.from_groups([tuple(np.concatenate([p[i] for p in pieces]) for i in range(3))
                                        for pieces in stacks], GROUP, device)
    if not all(isinstance(p, W8Tensor) for pieces in stacks for p in pieces):
        return None
    combined = [_combine_w8(pieces) for pieces in stacks]
    if any(c is None for c in combined) or len({(c.weight.dtype, c.block_size) for c in combined}) > 1:
        return None
    return W8Experts(torch.stack([c.weight for c in combined]).to(device),
                     torch.stack([c.scale for c in combined]).to(device), combined[0].block_size)


class _Params(dict):
    """The model's parameters by name; one still on the meta device (a model built deferred) is allocated on
    `device` when first written, under every name it has (a tied head and its embedding stay one tensor)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__(model.named_parameters(remove_duplicate=False))
        self.model, self.device = model, device

    def dense(self, name: str) -> torch.Tensor:
        param = self[name]
        if param.is_meta:
            real = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=self.device), requires_grad=False)
            for alias in [n for n, p in self.items() if p is param]:
                owner, _, attr = alias.rpartition(".")
                self.model.get_submodule(owner)._parameters[attr] = real
                self[alias] = real
            param = real
        return param


def load_weights(
    model: nn.Module, weight_map: WeightMap, tensors: Iterable[tuple[str, torch.Tensor | Packed]], tied_lm_head: bool,
    device: torch.device, quantized_params: Iterable[str] = (),
) -> None:
    """Fill every mapped parameter exactly once; fail naming any missing, unexpected or misshapen tensor.

    A tensor may come quantized: 4-bit groups (GGUF Q4_*) or an 8-bit weight with its scales. A parameter in
    `quantized_params` whose every piece comes in one such format is kept quantized (an `Int4Weight` or
    `W8Weight` in its place); any other gets the pieces dequantized. Parameters still on the meta device are
    allocated on `device` as they are written, so one kept quantized is never allocated dense.
    """
    params = _Params(model, device)
    keep = set(quantized_params)
    pieces = Counter(slot.param for slot in weight_map.values())
    groups: dict[str, list[tuple[WeightSlot, str, Packed]]] = {}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in tensors:
        slot = weight_map.get(name)
        if slot is None:
            if name.endswith(IGNORED_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
                continue
            unexpected.append(name)
            continue
        target = _target(params[slot.param], slot)
        if target.shape != tensor.shape:
            raise WeightLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)}")
        if name in loaded:
            raise WeightLoadError(f"tensor {name!r} appears twice in the checkpoint")
        if isinstance(tensor, Packed):
            groups.setdefault(slot.param, []).append((slot, name, tensor))
        else:
            _target(params.dense(slot.param), slot).copy_(tensor)
        loaded.add(name)
    if unexpected:
        raise WeightLoadError(f"unexpected tensors in checkpoint: {', '.join(sorted(unexpected)[:20])}")
    missing = sorted(set(weight_map) - loaded)
    if missing:
        raise WeightLoadError(f"missing tensors in checkpoint: {', '.join(missing[:20])}")
    for param_name, parts in groups.items():
        combined = _combine(parts, device) if param_name in keep and len(parts) == pieces[param_name] else None
        if combined is not None:
            replace_weight(model, param_name, combined)
            continue
        param = params.dense(param_name)
        for slot, _, part in parts:  # not kept quantized: dequantized like any other tensor
            _target(param, slot).copy_(part.dequantize(param.dtype))
    unfilled = sorted(name for name, p in model.named_parameters() if p.is_meta)
    if unfilled:
        raise WeightLoadError(f"parameters no checkpoint tensor fills: {', '.join(unfilled[:20])}")
