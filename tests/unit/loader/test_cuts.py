"""A rank's slice of a quantized weight equals the same slice of the dequantized weight: 4-bit groups, 8-bit block
and per-channel scales, GGUF blocks; cuts across a block are refused naming the tensor and the numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from infer.loader.cuts import cut_gguf_raw, cut_int4, cut_w8, pad_value
from infer.loader.gguf_quant import Int4Groups
from infer.loader.hf_quant import W8Tensor
from infer.models.shard import Cut, ShardError


def _int4(rows: int, cols: int) -> Int4Groups:
    rng = np.random.default_rng(0)
    return Int4Groups(rng.integers(0, 16, (rows, cols)).astype(np.uint8),
                      rng.random((rows, cols // 32)).astype(np.float32), rng.random((rows, cols // 32)).astype(np.float32))


def test_int4_cut_rows_columns_and_padding():
    groups = _int4(10, 128)
    dense = groups.dequantize(torch.float32)
    assert torch.equal(cut_int4("w", groups, Cut(1, 64, 128, 64)).dequantize(torch.float32), dense[:, 64:])
    padded = cut_int4("w", groups, Cut(0, 6, 10, 6)).dequantize(torch.float32)
    assert torch.equal(padded[:4], dense[6:]) and torch.equal(padded[4:], torch.zeros(2, 128))
    with pytest.raises(ShardError, match=r"tensor 'w'.*\[16, 80\) of dimension 1 \(128\).*4-bit group blocks of 32"):
        cut_int4("w", groups, Cut(1, 16, 80, 64))


def test_w8_cut_on_block_boundaries_inside_one_block_and_refused_across():
    weight = torch.randint(-100, 100, (256, 256), dtype=torch.int8)
    blocks = W8Tensor(weight, torch.rand(2, 2), (128, 128))
    dense = blocks.dequantize(torch.float32)
    assert torch.equal(cut_w8("w", blocks, Cut(0, 128, 256, 128)).dequantize(torch.float32), dense[128:])
    assert torch.equal(cut_w8("w", blocks, Cut(1, 32, 96, 64)).dequantize(torch.float32), dense[:, 32:96])  # one block
    with pytest.raises(ShardError, match=r"\[64, 192\) of dimension 0 \(256\), which splits its 8-bit scale blocks"):
        cut_w8("w", blocks, Cut(0, 64, 192, 128))
    channel = W8Tensor(weight, torch.rand(256, 1), (1, 256))  # per-row scales: any column cut keeps them
    assert torch.equal(cut_w8("w", channel, Cut(1, 100, 200, 100)).dequantize(torch.float32),
                       channel.dequantize(torch.float32)[:, 100:200])
    padded = pad_value("w", cut_w8("w", channel, Cut(0, 250, 256, 8)), Cut(0, 250, 256, 8))
    assert padded.weight.shape == (8, 256) and torch.equal(padded.dequantize(torch.float32)[6:], torch.zeros(2, 256))


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.F16])
def test_gguf_raw_cut_equals_the_dequantized_slice(kind):
    w = np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)
    raw = quantize(w, kind)
    whole = dequantize(raw, kind)
    assert np.array_equal(dequantize(cut_gguf_raw("w", raw, kind, Cut(1, 256, 512, 256)), kind), whole[:, 256:])
    assert np.array_equal(dequantize(cut_gguf_raw("w", raw, kind, Cut(0, 1, 3, 2)), kind), whole[1:3])
    if kind != GGMLQuantizationType.F16:
        with pytest.raises(ShardError, match=kind.name):
            cut_gguf_raw("w", raw, kind, Cut(1, 16, 272, 256))


def test_padding_a_column_cut_of_4bit_groups_pads_whole_groups():
    """A rank's 4-bit column slice read as it is stored (GGUF raw blocks), then padded to the cut's size: the values
    get zero columns and the scales and zeros zero groups, not one padding column per value."""
    part = _int4(6, 64)
    padded = pad_value("w", part, Cut(1, 64, 160, 96))
    assert padded.q.shape == (6, 96) and padded.scale.shape == padded.zero.shape == (6, 3)
    dense = padded.dequantize(torch.float32)
    assert torch.equal(dense[:, :64], part.dequantize(torch.float32)) and not dense[:, 64:].any()
    assert pad_value("w", part, Cut(1, 64, 128, 64)).scale.shape == (6, 2)
