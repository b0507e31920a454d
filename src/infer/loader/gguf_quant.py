"""GGUF 4-bit blocks read as they are: Q4_0, Q4_1 and Q4_K tensors become 4-bit values with one scale and zero per
group of 32 columns, the layout `lz.linear_int4` takes, so the weights stay 4-bit in memory (docs/quantization.md).

Every one of these formats is w = scale * q + offset per group of 32 (q in 0..15), which is the kernel's
w = (q - 8) * scale + zero with zero = offset + 8 * scale:
- Q4_0 (18-byte blocks: fp16 d, 16 bytes of nibbles): w = d * (q - 8).
- Q4_1 (20 bytes: fp16 d, fp16 m, nibbles): w = d * q + m.
- Q4_K (256-value super-blocks, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit sub-scales and sub-mins, 128
  bytes of nibbles): for sub-block j, w = d * sc_j * q - dmin * m_j.
In a block, byte i holds value i in its low nibble and value i + 16 (Q4_K: i + 32 within each 64) in its high one.
Q8_0 (34-byte blocks: fp16 d, 32 int8 values q; w = d * q) is kept as int8 with one float32 scale per row and block
of 32 columns, the layout `lz.linear_w8` takes with block_size (1, 32).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType

GROUP = 32
INT4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)


class Int4Groups(NamedTuple):
    """A weight [N, K] as 4-bit values: w = (q - 8) * scale + zero for each group of 32 columns."""

    q: np.ndarray  # [N, K] uint8 in 0..15
    scale: np.ndarray  # [N, K / 32] float32
    zero: np.ndarray  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, ...]:
        """The float weight's shape."""
        return self.q.shape

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(dequantize_groups(self)).to(dtype)


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def read_int4(data: np.ndarray, kind: GGMLQuantizationType) -> Int4Groups:
    """The groups of a Q4_0 / Q4_1 / Q4_K tensor's raw blocks (`data` [N, bytes per row] uint8, as gguf reads it)."""
    rows = data.shape[0]
    if kind in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        size = 18 if kind == GGMLQuantizationType.Q4_0 else 20
        blocks = data.reshape(rows, -1, size)
        d = _f16(blocks[..., 0:2])
        if kind == GGMLQuantizationType.Q4_0:
            q, zero = _nibbles(blocks[..., 2:18]), np.zeros_like(d)
        else:
            q, zero = _nibbles(blocks[..., 4:20]), _f16(blocks[..., 2:4]) + 8 * d
        return Int4Groups(q.reshape(rows, -1), d, zero.astype(np.float32))
    if kind == GGMLQuantizationType.Q4_K:
        blocks = data.reshape(rows, -1, 144)
        d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, m = _k4_scales(blocks[..., 4:16])  # [N, B, 8] each
        qs = blocks[..., 16:144].reshape(rows, -1, 4, 32)  # four chunks of 64 values
        q = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(rows, -1)  # chunk c: sub-blocks 2c (low), 2c + 1 (high)
        scale = (d[..., None] * sc).reshape(rows, -1)
        offset = -(dmin[..., None] * m).reshape(rows, -1)
        return Int4Groups(q, scale.astype(np.float32), (offset + 8 * scale).astype(np.float32))
    raise ValueError(f"{kind.name} is not a 4-bit format with groups of 32 (kept 4-bit: Q4_0, Q4_1, Q4_K)")


def read_q8_0(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 tensor's raw blocks (`data` [N, bytes per row] uint8) as (q [N, K] int8, scale [N, K / 32] float32)."""
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, 34)
    return blocks[..., 2:].copy().view(np.int8).reshape(rows, -1), _f16(blocks[..., 0:2])


def _k4_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's eight 6-bit sub-scales and sub-mins from 12 bytes (llama.cpp's get_scale_min_k4)."""
    raw = raw.astype(np.uint32)
    sc = np.empty((*raw.shape[:-1], 8), dtype=np.float32)
    m = np.empty_like(sc)
    sc[..., :4] = raw[..., 0:4] & 63
    m[..., :4] = raw[..., 4:8] & 63
    sc[..., 4:] = (raw[..., 8:12] & 0xF) | ((raw[..., 0:4] >> 6) << 4)
    m[..., 4:] = (raw[..., 8:12] >> 4) | ((raw[..., 4:8] >> 6) << 4)
    return sc, m


def dequantize_groups(groups: Int4Groups) -> np.ndarray:
    """The float32 weight the groups stand for (tests compare it with gguf's own dequantization)."""
    scale = np.repeat(groups.scale, GROUP, axis=1)
    zero = np.repeat(groups.zero, GROUP, axis=1)
    return (groups.q.astype(np.float32) - 8) * scale + zero
