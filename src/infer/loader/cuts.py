"""Read one rank's slice of a checkpoint tensor (models/shard.py says which): safetensors slices, GGUF blocks and
8-bit / 4-bit weights cut where their block layout allows, refused naming the tensor and the numbers where not."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from infer.loader.gguf_quant import GROUP, Int4Groups
from infer.loader.hf_quant import W8Tensor
from infer.models.shard import Cut, ShardError

CutFor = Callable[[str], Cut | None]  # a checkpoint tensor's name -> the slice this rank reads (None: all of it,
# shard.ELSEWHERE: none, another rank holds it whole)
FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def _index(cut: Cut, length: int) -> tuple[slice, ...]:
    """The numpy / safetensors index of a cut along a dimension of `length` (rows past it are padding)."""
    part = slice(cut.start, min(cut.stop, length))
    return (part,) if cut.dim == 0 else (slice(None), part)


def _aligned(name: str, cut: Cut, block: int, length: int, what: str) -> None:
    """ShardError unless the cut starts and ends on a block boundary (or at the tensor's end)."""
    if cut.start % block or (cut.stop % block and cut.stop < length):
        raise ShardError(f"tensor {name!r}: a tensor-parallel rank reads [{cut.start}, {cut.stop}) of dimension "
                         f"{cut.dim} ({length}), which splits its {what} blocks of {block}; use a tensor_parallel_size "
                         f"that splits on block boundaries, or a checkpoint that is not block-quantized")


def pad_tensor(t: torch.Tensor, cut: Cut) -> torch.Tensor:
    """Zero rows (or columns) past the checkpoint's end up to the cut's size (the vocabulary's padding)."""
    have = t.shape[cut.dim]
    if have == cut.size:
        return t
    shape = list(t.shape)
    shape[cut.dim] = cut.size
    out = torch.zeros(shape, dtype=t.dtype)
    out.narrow(cut.dim, 0, have).copy_(t)
    return out


def cut_tensor(t: torch.Tensor, cut: Cut) -> torch.Tensor:
    return pad_tensor(t[_index(cut, t.shape[cut.dim])].contiguous(), cut)


def read_cut(read_slice: object, shape: list[int], cut: Cut) -> torch.Tensor:
    """Only the cut's part of a safetensors tensor, unpadded (`read_slice`: safe_open(...).get_slice(name))."""
    return read_slice[_index(cut, shape[cut.dim])]  # type: ignore[index]


def pad_value(name: str, value: torch.Tensor | Int4Groups | W8Tensor, cut: Cut) -> torch.Tensor | Int4Groups | W8Tensor:
    """A cut tensor, dense or quantized, zero-padded to the cut's size (padding rows of 4-bit or per-row 8-bit weights
    are zero weights too)."""
    if isinstance(value, torch.Tensor):
        return pad_tensor(value, cut)
    if isinstance(value, Int4Groups):
        if cut.dim == 1:  # the scales and zeros hold one column per group of 32
            groups = Cut(1, cut.start // GROUP, -(-cut.stop // GROUP), -(-cut.size // GROUP))
            return Int4Groups(_pad_np(value.q, cut), *(_pad_np(a, groups) for a in value[1:]))
        return Int4Groups(*(_pad_np(a, cut) for a in value))
    if value.weight.shape[cut.dim] == cut.size:
        return value
    if value.block_size[cut.dim] > 1:
        raise ShardError(f"tensor {name!r}: its 8-bit scale blocks of {value.block_size[cut.dim]} cannot be padded to "
                         f"the {cut.size} rows a tensor-parallel rank holds; use --quantization none")
    return W8Tensor(pad_tensor(value.weight, cut), pad_tensor(value.scale, cut), value.block_size)


def cut_w8(name: str, w8: W8Tensor, cut: Cut, weight: torch.Tensor | None = None) -> W8Tensor:
    """An 8-bit weight's slice with its scales' slice; `weight`: the cut weight when it was read as a slice."""
    length, block = w8.weight.shape[cut.dim], w8.block_size[cut.dim]
    end = min(cut.stop, length)
    if cut.start // block != (end - 1) // block:  # a cut inside one scale block keeps its scale (per-channel ones)
        _aligned(name, cut, block, length, "8-bit scale")
    blocks = Cut(cut.dim, cut.start // block, (end - 1) // block + 1, -(-cut.size // block))
    part = W8Tensor(w8.weight[_index(cut, length)].contiguous() if weight is None else weight,
                    w8.scale[_index(blocks, w8.scale.shape[cut.dim])].contiguous(), w8.block_size)
    return pad_value(name, part, cut)  # type: ignore[return-value]


def cut_int4(name: str, groups: Int4Groups, cut: Cut) -> Int4Groups:
    """4-bit groups of 32 columns: rows cut anywhere (padding rows are zero weights), columns on group boundaries."""
    if cut.dim == 1:
        _aligned(name, cut, GROUP, groups.q.shape[1], "4-bit group")
        cols = Cut(1, cut.start // GROUP, cut.stop // GROUP, cut.size // GROUP)
        return Int4Groups(_pad_np(groups.q[_index(cut, groups.q.shape[1])], cut),
                          *(_pad_np(a[_index(cols, a.shape[1])], cols) for a in groups[1:]))
    return Int4Groups(*(_pad_np(a[_index(cut, a.shape[0])], cut) for a in groups))


def _pad_np(part: np.ndarray, cut: Cut) -> np.ndarray:
    if part.shape[cut.dim] == cut.size:
        return np.ascontiguousarray(part)
    shape = list(part.shape)
    shape[cut.dim] = cut.size
    out = np.zeros(shape, dtype=part.dtype)
    out[tuple(slice(0, n) for n in part.shape)] = part
    return out


def cut_gguf_raw(name: str, data: np.ndarray, kind: GGMLQuantizationType, cut: Cut) -> np.ndarray:
    """A GGUF tensor's stored data (memory-mapped: only the rows read are touched) cut before it is converted; a
    quantized tensor's columns are cut in whole blocks. Padding is added after conversion (`pad_tensor`)."""
    if kind in FLOAT_TYPES or cut.dim == 0:
        return data[_index(cut, data.shape[cut.dim])]
    block, nbytes = GGML_QUANT_SIZES[kind]
    columns = data.shape[1] // nbytes * block
    _aligned(name, cut, block, columns, f"{kind.name}")
    return data[:, cut.start // block * nbytes : -(-cut.stop // block) * nbytes]
