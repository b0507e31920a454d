"""A GGUF's Q8_0 linear weights stay 8-bit on the CPU (int8 with one scale per row and block of 32 columns, the native
int8 kernel): a tiny Llama written here as a GGUF with Q8_0 projections loads kept 8-bit under "auto", its values
equal gguf's own dequantization, and its logits equal the same file dequantized ("none")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from checkpoints import tiny_hf_model
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch
from infer.models.quant import W8Weight

Q8_0 = GGMLQuantizationType.Q8_0
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (HF's split rotary halves to interleaved), as its converter applies it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path: Path, seed: int = 4) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny Llama as llama.cpp would write it, every projection Q8_0; returns the file and the raw Q8_0 blocks."""
    model = tiny_hf_model("llama", seed)  # its llama3 rope scaling is left out of the file: both loads share that
    cfg, state = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    raw = {}
    for i in range(cfg.num_hidden_layers):
        for hf, ours in LAYER.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            name = f"blk.{i}.{ours}.weight"
            if w.ndim == 1:
                writer.add_tensor(name, w)
                continue
            if ours in ("attn_q", "attn_k"):
                w = _permute(w, cfg.num_attention_heads if ours == "attn_q" else cfg.num_key_value_heads)
            raw[name] = quantize(w, Q8_0)
            writer.add_tensor(name, raw[name], raw_dtype=Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, raw


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
