"""Checkpoint weights for the MLX models, read by infer's own loaders (the same configs and weight-name maps as the
torch models: one source of truth for shapes and names) and handed to MLX once.

A GGUF's 4-bit groups (Q4_0, Q4_1, Q4_K: w = (q - 8) * scale + zero per 32 columns) and Q8_0 blocks (w = d * q per
32 columns) are MLX's affine group formats exactly (w = scale * q' + bias per group of 32), so those linear weights
stay quantized and run through `mx.quantized_matmul`: the nibbles are repacked by a byte view, never requantized.
Everything else (F16/F32 tensors, Q6_K and other GGUF types, 8-bit HF checkpoints whose FP8 values or per-row
int8 scales MLX's groups cannot hold) is dequantized to the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import torch

from infer.loader.gguf_loader import gguf_head_q8_0
from infer.loader.model_loader import (LoadedModel, build_model, checkpoint_quant, checkpoint_tensors,
                                       init_dummy_weights, is_gguf, read_config)
from infer.loader.weights import load_weights
from infer.models.quant import Int4Weight, QuantWeight, W8Weight

MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
GROUP = 32


def load_torch_model(path: Path, load_format: str, quantization: str, max_positions: int) -> LoadedModel:
    """The checkpoint through infer's loaders into a float32 torch model on the CPU (the staging copy the MLX
    arrays are made from); with quantization "auto" a GGUF's 4-bit and Q8_0 linear weights stay packed."""
    cfg = read_config(path)
    model = build_model(cfg, torch.float32, "cpu", max_positions, deferred=load_format != "dummy")
    if load_format == "dummy":
        init_dummy_weights(model)
        return LoadedModel(model, cfg, path)
    keep = quantization == "auto" and is_gguf(path)
    tensors = checkpoint_tensors(path, torch.float32, keep, checkpoint_quant(path), keep)
    with torch.no_grad():
        load_weights(model, model.weight_map(), tensors, cfg.tie_word_embeddings, torch.device("cpu"),
                     model.linear_weights() if keep else ())
    return LoadedModel(model, cfg, path)


@dataclass
class Linear:
    """x @ W.T (+ bias) with W dense [N, K], or packed for `mx.quantized_matmul` (affine groups of `group_size`)."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0  # 0: dense
    group_size: int = GROUP
    bias: mx.array | None = None
    # a quantized matmul of float16 / bfloat16 rows computed on float32 rows: MLX's CPU backend accumulates a
    # half-precision quantized matmul in half precision (~14x the error of a dense float16 matmul; float32 rows give
    # the dense one's), while Metal's kernels accumulate in float32 already
    widen: bool = False

    def __call__(self, x: mx.array) -> mx.array:
        if self.bits and self.widen and x.dtype != mx.float32:
            out = mx.quantized_matmul(x.astype(mx.float32), self.weight, self.scales, self.biases, transpose=True,
                                      group_size=self.group_size, bits=self.bits).astype(x.dtype)
        elif self.bits:
            out = mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                      group_size=self.group_size, bits=self.bits)
        else:
            out = x @ self.weight.T
        return out if self.bias is None else out + self.bias

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.weight, self.scales, self.biases, self.bias) if a is not None]

    @property
    def quantized(self) -> bool:
        return self.bits != 0


def to_mx(t: torch.Tensor, dtype: mx.Dtype) -> mx.array:
    return mx.array(t.detach().to(torch.float32).contiguous().numpy()).astype(dtype)


def int4_linear(w: Int4Weight, dtype: mx.Dtype) -> Linear:
    """A 4-bit GGUF weight as MLX's 4-bit affine groups: the same nibbles (low nibble first, 8 to a uint32 word),
    scale as stored, bias = zero - 8 * scale (MLX's q' is the stored q, the kernel's q - 8 is folded in)."""
    if w.group_size != GROUP:
        raise ValueError(f"4-bit groups of {w.group_size} columns; MLX's affine format here takes {GROUP}")
    n, k = w.shape
    packed = w.qweight.contiguous().numpy().view(np.uint32).reshape(n, k // 8)
    scale, zero = w.scales_zeros[..., 0].T.contiguous(), w.scales_zeros[..., 1].T.contiguous()  # [N, K / 32]
    return Linear(mx.array(packed), to_mx(scale, dtype), to_mx(zero - 8 * scale, dtype), bits=4,
                  widen=_widen_quantized())


def w8_linear(weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int], dtype: mx.Dtype) -> Linear | None:
    """An int8 weight with a scale per row and 32 columns (GGUF Q8_0) as MLX's 8-bit affine groups: q' = q + 128,
    bias = -128 * scale; None for any other block or value type."""
    if weight.dtype != torch.int8 or tuple(block_size) != (1, GROUP):
        return None
    n, k = weight.shape
    unsigned = (weight.numpy().astype(np.int16) + 128).astype(np.uint8)
    packed = unsigned.view(np.uint32).reshape(n, k // 4)
    return Linear(mx.array(packed), to_mx(scale, dtype), to_mx(-128 * scale, dtype), bits=8, widen=_widen_quantized())


def _widen_quantized() -> bool:
    """Whether quantized matmuls run on float32 rows: on MLX's CPU backend (see `Linear.widen`)."""
    return mx.default_device() != mx.gpu


def linear(w: torch.Tensor | QuantWeight, dtype: mx.Dtype, bias: torch.Tensor | None = None) -> Linear:
    """One projection's weight in MLX: kept quantized where MLX's formats hold it exactly, else dense."""
    out: Linear | None = None
    if isinstance(w, Int4Weight):
        out = int4_linear(w, dtype)
    elif isinstance(w, W8Weight):
        out = w8_linear(w.weight, w.scale, w.block_size, dtype)
    if out is None:
        out = Linear(to_mx(w.dequantize() if isinstance(w, QuantWeight) else w, dtype))
    out.bias = None if bias is None else to_mx(bias, dtype)
    return out


def lm_head(loaded: LoadedModel, dtype: mx.Dtype, quantization: str) -> Linear:
    """The LM head: a GGUF's Q8_0 head (or tied Q8_0 embedding) kept 8-bit with "auto", else as loaded."""
    if quantization == "auto" and is_gguf(loaded.source):
        head = gguf_head_q8_0(loaded.source)
        kept = None if head is None else w8_linear(head.weight, head.scale, head.block_size, dtype)
        if kept is not None:
            return kept
    return linear(loaded.model.lm_head, dtype)
