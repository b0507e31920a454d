"""LoRA adapters on CUDA: triton.lora_shrink and triton.lora_expand against the float64 definition (rows without an
adapter, several adapters in one tile, every row on one adapter, slots nobody uses, bf16), and the engine with decode
and prefill graphs under INFER_STRICT_SYNC: a batch mixing adapters and the base model gives the CPU runner's greedy
tokens, and an adapter swapped out and back in gives the same tokens again."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.triton.specs import LORA_EXPAND_ROWS, LORA_SHRINK_ROWS
from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from lora_adapters import module_shapes, write_random_adapter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _ids(rows: int, slots: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    if pattern == "same":
        return torch.full((rows,), 1, dtype=torch.int32, device="cuda")
    return torch.randint(-1, slots - 1, (rows,), generator=gen, device="cuda", dtype=torch.int32)  # last slot unused


@pytest.mark.parametrize("rows", [1, 5, 40, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["mixed", "same"])
def test_triton_lora_kernels_match_the_definition(rows, dtype, pattern):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    slots, rank, k, n = 4, 48, 320, 200
    x = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
    a = (torch.randn(slots, rank, k, device="cuda", generator=gen) * 0.1).to(dtype)
    b = (torch.randn(slots, n, rank, device="cuda", generator=gen) * 0.1).to(dtype)
    y = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    ids = _ids(rows, slots, pattern, gen)
    assert lz.which("lora_shrink", x, a, ids)["kernel_id"] == (
        "triton.lora_shrink_rows" if rows <= LORA_SHRINK_ROWS else "triton.lora_shrink")
    assert lz.which("lora_expand", y, torch.zeros(rows, rank, device="cuda"), b, ids)["kernel_id"] == (
        "triton.lora_expand_rows" if rows <= LORA_EXPAND_ROWS else "triton.lora_expand")
    has = (ids >= 0).double()[:, None]
    slot = ids.long().clamp(min=0)
    want_h = torch.einsum("tk,trk->tr", x.double(), a[slot].double()) * has
    want_y = y.double() + torch.einsum("tr,tnr->tn", want_h, b[slot].double()) * has
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    h = lz.lora_shrink(x, a, ids)
    torch.testing.assert_close(h.double(), want_h, atol=tol, rtol=tol)
    out = lz.lora_expand(y.clone(), h, b, ids)
    torch.testing.assert_close(out.double(), want_y, atol=tol * 4, rtol=tol)
    from layerzero.kernels.triton import lora as triton_lora  # imports triton: CUDA machines only

    for shrink in (triton_lora.lora_shrink, triton_lora.lora_shrink_rows):  # the paths not chosen hold too
        h = shrink(x, a, ids)
        torch.testing.assert_close(h.double(), want_h, atol=tol, rtol=tol)
    for expand in (triton_lora.lora_expand, triton_lora.lora_expand_rows):
        torch.testing.assert_close(expand(y.clone(), h, b, ids).double(), want_y, atol=tol * 4, rtol=tol)
    if rows > 256:  # a prefill's coarse K split and an unsplit K
        for tile in ((64, 64, 1024, 4), (16, 128, 1 << 20, 4)):
            torch.testing.assert_close(triton_lora.lora_shrink(x, a, ids, tile).double(), want_h, atol=tol, rtol=tol)


def _adapters(path, cfg, tmp_path, count: int) -> dict[str, str]:
    shapes = module_shapes(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.head_dim)
    return {f"a{i}": str(write_random_adapter(tmp_path / f"a{i}", cfg.num_hidden_layers, shapes, rank=8, seed=i,
                                              dtype=torch.float32, scale=0.3)) for i in range(count)}


def test_engine_with_graphs_equals_the_cpu_runner(tmp_path, monkeypatch):
    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    cpu = LLM(str(path), device="cpu", dtype="float32", max_seq_len=128, enable_lora=True, max_loras=3)
    modules = _adapters(path, cpu.model_config, tmp_path, 3)
    for name, adapter in modules.items():
        cpu.add_lora(name, adapter)
    prompts = [[5, 9, 13, 22, 40] * (1 + i) for i in range(8)]
    names = [None, "a0", "a1", "a2", "a0", None, "a2", "a1"]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    per_row = [SamplingParams(temperature=0, max_tokens=12, lora=n) for n in names]
    want = [o.token_ids for o in cpu.generate_ids(prompts, per_row)]
    assert len({tuple(w) for w in want}) > 4  # the adapters change the tokens
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    llm = LLM(str(path), device="cuda", dtype="float32", max_seq_len=128, max_batch_size=8, enable_lora=True,
              max_loras=2, lora_modules=modules)  # 3 adapters over 2 slots: some wait, then swap in
    assert [o.token_ids for o in llm.generate_ids(prompts, per_row)] == want
    alone = [llm.generate_ids([p], s)[0].token_ids for p, s in zip(prompts, per_row)]
    assert alone == want
    assert llm.generate_ids(prompts[:1], greedy)[0].token_ids == want[0]
    monkeypatch.delenv("INFER_STRICT_SYNC")
