"""bfloat16 checkpoints on the CPU (`dtype="bfloat16"`): the model computes in float32 and holds its linear weights
and LM head in bf16 (`HalfWeight`), its KV cache in bf16. Steps of a few rows (decode) go through layerzero's native
bf16-weight GEMV, exact float32 products, so a forward's logits equal transformers' float32 forward over the same bf16
weights to float32 rounding; the engine rounds K and V to bf16 in its cache and greedy decoding still gives
transformers' tokens here; longer prompts go through oneDNN's bf16 GEMM (the rows rounded to bf16), within bf16's
error."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from checkpoints import FAMILIES, save_tiny, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.engine.config import EngineConfig
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch
from infer.models.quant import HalfWeight
import layerzero as lz
from layerzero.kernels import onednn
from layerzero.kernels.native.linear import BF16_MAX_ROWS
from test_model_parity import BF16_RTOL_OF_MAX, FP32_ATOL, _max_diff, _our_logits, _prompts, transformers_greedy


def _to_bf16(path):
    """Rewrite a saved tiny checkpoint with its weights in bfloat16, as a bf16 checkpoint is published."""
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_float32_over_the_bf16_weights(family, tmp_path):
    path = _to_bf16(save_tiny(family, tmp_path, hidden_size=64))
    ours = load_model(path, torch.float32, matmul_dtype=torch.bfloat16).model
    halves = [m for m in ours.modules() if isinstance(m, HalfWeight)]
    assert halves and all(h.weight.dtype == torch.bfloat16 for h in halves) and isinstance(ours.lm_head, HalfWeight)
    assert ours.embed.dtype == torch.float32  # the lookup keeps its float32 table (bf16 values)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(4, ours.config.vocab_size, seed=5)
    short = [p for p in prompts if len(p) <= BF16_MAX_ROWS]  # [3, 1]: one forward each, the GEMV's rows
    for prompt in short:
        diff, largest = _max_diff(_our_logits(ours, [prompt]), hf, [prompt])
        assert largest > 1.0 and diff <= FP32_ATOL
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)  # 53 rows: oneDNN's bf16 GEMM
    assert diff <= BF16_RTOL_OF_MAX * largest


def test_without_bf16_products_the_gemms_multiply_in_float32(monkeypatch, tmp_path):
    """A CPU without AVX512-BF16 or AMX (an AVX2 one; forced here): oneDNN multiplies the bf16 weights from a float32
    packed copy and the blocks keep float32 rows, so a 53-row forward's logits equal transformers' float32 forward
    to float32 rounding, as the GEMV's do (with bf16 products it is within bf16's error)."""
    monkeypatch.setattr(onednn, "bf16_gemm", lambda: False)
    monkeypatch.setattr(lz, "cpu_bf16_gemm", lambda: False)
    path = _to_bf16(save_tiny(FAMILIES[0], tmp_path, hidden_size=64))
    ours = load_model(path, torch.float32, matmul_dtype=torch.bfloat16).model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(4, ours.config.vocab_size, seed=5)
    assert ours.blocks[0].half_rows(torch.zeros(53, 64)) is None
    with lz.prefer("onednn.linear"):  # over the AMX kernel where this CPU has one (it rounds rows to bf16)
        diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert largest > 1.0 and diff <= FP32_ATOL


def test_engine_greedy_tokens_equal_transformers(tmp_path):
    """Prompts of at most 4 tokens, decoded alone: every step's rows go through the exact GEMV."""
    path = _to_bf16(save_tiny_with_tokenizer("qwen3", tmp_path, seed=6))
    prompts = [[5, 9, 33, 2], [200, 7]]
    llm = LLM(str(path), device="cpu", dtype="bfloat16", max_seq_len=96, max_batch_size=1)
    assert llm.config.torch_dtype == torch.float32 and llm.config.matmul_dtype == torch.bfloat16
    assert all(c.dtype == torch.bfloat16 for layer in llm.runner.kv_caches for c in layer)  # half the bytes to attend
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert [o.token_ids for o in llm.generate_ids(prompts, greedy)] == transformers_greedy(path, prompts)


def test_the_dtypes_each_device_resolves():
    cpu = EngineConfig(device="cpu", dtype="bfloat16")
    assert (cpu.weight_dtype, cpu.torch_dtype, cpu.matmul_dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    assert cpu.kv_cache_dtype == torch.bfloat16
    assert EngineConfig(device="cpu", dtype="float32").matmul_dtype is None
    assert EngineConfig(device="cpu", dtype="float32").kv_cache_dtype == torch.float32
    assert EngineConfig(device="cpu").torch_dtype == torch.float32
    cuda = EngineConfig(device="cuda", dtype="bfloat16")
    assert (cuda.torch_dtype, cuda.matmul_dtype) == (torch.bfloat16, None)
