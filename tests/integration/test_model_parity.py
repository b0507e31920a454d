"""Logits parity against transformers for tiny random Llama 3 / Qwen 3 / Gemma 3 / Mistral / Phi-3 checkpoints
(safetensors, single and sharded; Mistral and Phi-3 also as GGUF), and Mistral's and Phi-3's greedy tokens through
the engine on the torch runner."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from checkpoints import FAMILIES, VARIANTS, save_tiny, save_tiny_with_tokenizer, tiny_hf_model, write_f32_gguf
from infer import LLM, SamplingParams
from infer.debug import activation_diff
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch

FP32_ATOL = 1e-4
# bf16 bound, relative to the largest reference logit. Measured here (max |diff| / max |logit|):
# llama 0.033/2.5 (1.3%), qwen3 0.156/11.5 (1.4%), gemma3 0.125/20.4 (0.6%); fp32 diffs are
# <= 5e-6. We keep norms and rope in float32 where transformers rounds some of them to bf16.
BF16_RTOL_OF_MAX = 0.02
CHECKPOINTS = {family: (family, {}) for family in FAMILIES} | VARIANTS  # name -> (family, config overrides)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module", params=[(name, s) for name in CHECKPOINTS for s in (False, True)],
                ids=lambda p: f"{p[0]}-{'sharded' if p[1] else 'single'}")
def checkpoint(request, tmp_path_factory):
    name, sharded = request.param
    family, overrides = CHECKPOINTS[name]
    path = save_tiny(family, tmp_path_factory.mktemp(name), sharded=sharded, **overrides)
    if sharded:
        assert (path / "model.safetensors.index.json").exists()
    return family, path


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts of 3, 40, 9 and 1 tokens: the 40 outgrow Mistral's and Phi-3's windows and Phi-3's original context."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 40, 9, 1][:n]
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


def _our_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    ids = torch.tensor([t for p in prompts for t in p])
    with torch.no_grad():
        logits = model.compute_logits(model(ids, ForwardBatch.for_prompts([len(p) for p in prompts])))
    return list(logits.split([len(p) for p in prompts]))


def _max_diff(ours: list[torch.Tensor], hf, prompts: list[list[int]]) -> tuple[float, float]:
    """(max |ours - reference|, max |reference|) over all prompts and positions."""
    worst, largest = 0.0, 0.0
    with torch.no_grad():
        for got, prompt in zip(ours, prompts):
            ref = hf(torch.tensor([prompt])).logits[0].float()
            worst = max(worst, (got - ref).abs().max().item())
            largest = max(largest, ref.abs().max().item())
    return worst, largest


def _models(path, dtype: torch.dtype):
    """(our model, transformers' model) from the same checkpoint directory."""
    return load_model(path, dtype).model, AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def test_full_model_logits_fp32(checkpoint):
    ours, hf = _models(checkpoint[1], torch.float32)
    prompts = _prompts(4, ours.config.vocab_size, seed=1)
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert largest > 1.0 and diff <= FP32_ATOL


def test_single_layer_and_every_hook_point_fp32(checkpoint):
    ours, hf = _models(checkpoint[1], torch.float32)
    rows = activation_diff(ours, hf, _prompts(2, ours.config.vocab_size, seed=2)[1])
    assert rows[0].name == "blocks.0.resid_post"
    for row in rows:
        assert row.ref_max > 0.1, f"{row.name}: reference activations are ~0, the test would be vacuous"
        assert row.max_abs <= FP32_ATOL, f"{row.name}: {row.max_abs}"


def test_full_model_logits_bf16(checkpoint):
    ours, hf = _models(checkpoint[1], torch.bfloat16)
    prompts = _prompts(3, ours.config.vocab_size, seed=3)
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert diff <= BF16_RTOL_OF_MAX * largest


@pytest.mark.parametrize("name", ["mistral-full", "phi3-longrope", "phi3-partial-window", "phi3-plain"])
def test_gguf_logits_fp32(name, tmp_path):
    """The same weights as llama.cpp writes them (Mistral as "llama": it keeps no window, hence the full one)."""
    family, overrides = CHECKPOINTS[name]
    hf = tiny_hf_model(family, **overrides)
    ours = load_model(write_f32_gguf(hf, tmp_path / f"{name}.gguf"), torch.float32).model
    prompts = _prompts(4, ours.config.vocab_size, seed=4)
    diff, largest = _max_diff(_our_logits(ours, prompts), hf, prompts)
    assert largest > 1.0 and diff <= FP32_ATOL


def greedy_prompts() -> list[list[int]]:
    """Prompts of 12 and 40 tokens, both longer than Mistral's window; with their 16 new tokens the first stays inside
    Phi-3's original context of 32, the second starts past it."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, 320, (n,), generator=g).tolist() for n in (12, 40)]


def transformers_greedy(path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, GREEDY.max_tokens long, each token from a forward over the
    whole sequence so far (what its generate() approximates with a cache; it would also stop at EOS)."""
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(GREEDY.max_tokens):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(ids[len(prompt):])
    return out


@pytest.fixture(scope="module", params=VARIANTS)
def served(request, tmp_path_factory) -> tuple[str, list[list[int]]]:
    """A tiny Mistral / Phi-3 with a tokenizer, and transformers' greedy tokens for greedy_prompts()."""
    family, overrides = VARIANTS[request.param]
    path = save_tiny_with_tokenizer(family, tmp_path_factory.mktemp(request.param), seed=3, **overrides)
    return str(path), transformers_greedy(path, greedy_prompts())


def test_greedy_tokens_equal_transformers(served) -> None:
    """Both prompts in one batch through the paged cache (Phi-3: one sequence on LongRoPE's short factors, one on its
    long ones, in the same steps)."""
    path, expected = served
    llm = LLM(path, runner="torch", dtype="float32", max_seq_len=96, max_batch_size=4, block_size=4)
    assert [o.token_ids for o in llm.generate_ids(greedy_prompts(), GREEDY)] == expected
