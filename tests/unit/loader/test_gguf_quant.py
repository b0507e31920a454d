"""GGUF 4-bit blocks read as groups: exactly gguf's own dequantization for Q4_0 / Q4_1 (quantized here) and Q4_K (the
bundled Gemma 3 file), and the Llama Q/K row permutation moves whole rows with their groups."""

from __future__ import annotations

import gguf.quants as gq
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from infer.loader.gguf_loader import _unpermute
from infer.loader.gguf_file import open_gguf
from infer.loader.gguf_quant import Int4Groups, dequantize_groups, read_int4


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q4_0_and_q4_1_equal_gguf_dequantization(kind: T, seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=(12, 256)).astype(np.float32) * (seed + 1)
    raw = gq.quantize(x, kind)
    groups = read_int4(raw, kind)
    assert groups.q.shape == (12, 256) and groups.scale.shape == (12, 8) and groups.q.max() <= 15
    np.testing.assert_array_equal(dequantize_groups(groups), gq.dequantize(raw, kind))


def test_q4_k_equals_gguf_dequantization(gemma3_gguf) -> None:
    reader = open_gguf(gemma3_gguf)
    tensors = [t for t in reader.tensors if t.tensor_type == T.Q4_K][:3]
    assert tensors
    for tensor in tensors:
        np.testing.assert_array_equal(dequantize_groups(read_int4(tensor.data, T.Q4_K)),
                                      gq.dequantize(tensor.data, T.Q4_K))


def test_row_permutation_moves_groups_with_their_rows() -> None:
    raw = gq.quantize(np.random.default_rng(3).normal(size=(16, 64)).astype(np.float32), T.Q4_1)
    groups = read_int4(raw, T.Q4_1)
    moved = Int4Groups(*(_unpermute(a, 4) for a in groups))
    np.testing.assert_array_equal(dequantize_groups(moved), _unpermute(gq.dequantize(raw, T.Q4_1), 4))


def test_other_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="Q8_0 is not a 4-bit format"):
        read_int4(np.zeros((1, 34), dtype=np.uint8), T.Q8_0)
