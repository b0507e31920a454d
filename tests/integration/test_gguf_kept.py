"""A GGUF's quantized linear weights stay quantized on the CPU: Q8_0 as int8 with one scale per row and block of 32
columns (the native int8 kernel), Q4_0 / Q4_1 as 4-bit groups. A tiny Llama written here as a GGUF loads kept
quantized under "auto", its values equal gguf's own dequantization, and its outputs equal the same file dequantized
("none"). The same on CUDA: tests/gpu/test_lz_gpu_linear_int4.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from checkpoints import write_llama_gguf
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch
from infer.models.quant import Int4Weight, W8Weight

Q8_0 = GGMLQuantizationType.Q8_0
Q4_0, Q4_1 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1


def _hidden_and_logits(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), ForwardBatch.for_prompts([len(ids)]))
        return hidden, model.compute_logits(hidden)


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    return write_llama_gguf(tmp_path_factory.mktemp("q8") / "tiny-q8_0.gguf")


def test_q8_0_projections_stay_8bit_with_gguf_values(q8_gguf) -> None:
    path, raw = q8_gguf
    model = load_model(path, quantization="auto").model
    down = model.blocks[0].mlp.down_proj
    assert isinstance(down, W8Weight) and down.weight.dtype == torch.int8 and down.block_size == (1, 32)
    assert isinstance(model.blocks[1].attn.qkv_proj, W8Weight)  # fused q/k/v: scale rows concatenated
    want = dequantize(raw["blk.0.ffn_down.weight"], Q8_0)
    assert np.array_equal(down.dequantize().numpy(), want)  # bit for bit: int8 times the fp16 block scale
    dense = load_model(path, quantization="none").model
    assert isinstance(dense.blocks[0].mlp.down_proj, torch.nn.Parameter)
    qkv = dense.blocks[1].attn.qkv_proj.detach()
    assert torch.equal(model.blocks[1].attn.qkv_proj.dequantize(), qkv)  # un-permuted rows, scales with them


def test_q8_0_logits_equal_the_dequantized_file(q8_gguf) -> None:
    path, _ = q8_gguf
    kept, dense = load_model(path, quantization="auto").model, load_model(path, quantization="none").model
    ids = [5, 17, 200, 3, 99, 41, 7]
    (hidden, logits), (hidden_want, logits_want) = _hidden_and_logits(kept, ids), _hidden_and_logits(dense, ids)
    assert (hidden - hidden_want).abs().max().item() <= 1e-5 * hidden_want.abs().max().item()  # float32 both ways
    # "auto" holds a GGUF's LM head in float16 on the CPU (docs/quantization.md): its rounding, nothing more
    assert (logits - logits_want).abs().max().item() <= 2e-3 * logits_want.abs().max().item()


def test_4bit_and_8bit_projections_mixed(tmp_path) -> None:
    kinds = {"attn_q": Q4_0, "attn_k": Q4_0, "attn_v": Q4_0, "ffn_gate": Q4_1, "ffn_up": Q4_1, "ffn_down": Q4_0}
    path, raw = write_llama_gguf(tmp_path / "tiny-mixed.gguf", kinds=kinds)
    kept, dense = load_model(path, quantization="auto").model, load_model(path, quantization="none").model
    down, o = kept.blocks[0].mlp.down_proj, kept.blocks[0].attn.o_proj
    assert isinstance(kept.blocks[0].attn.qkv_proj, Int4Weight) and isinstance(down, Int4Weight)
    assert isinstance(o, W8Weight)  # attn_output: Q8_0 where kinds names none
    assert np.array_equal(down.dequantize().numpy(), dequantize(raw["blk.0.ffn_down.weight"], Q4_0))
    ids = [5, 17, 200, 3, 99, 41, 7]
    (hidden, _), (hidden_want, _) = _hidden_and_logits(kept, ids), _hidden_and_logits(dense, ids)
    assert (hidden - hidden_want).abs().max().item() <= 1e-5 * hidden_want.abs().max().item()  # float32 both ways


def test_a_tied_q8_0_head_stays_8bit_beside_its_float_embedding() -> None:
    from infer.loader.gguf_file import bundled_smollm2

    model = load_model(bundled_smollm2(), quantization="auto").model  # token_embd is Q8_0, the head tied to it
    head = model.lm_head
    assert isinstance(head, W8Weight) and head.weight.dtype == torch.int8 and head.block_size == (1, 32)
    assert model.embed.dtype == torch.float32 and torch.equal(head.dequantize(), model.embed.detach())
    hidden = torch.randn(3, model.embed.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got, want = model.compute_logits(hidden), hidden @ model.embed.detach().T
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()  # float32 both ways
