"""Mixtures of experts against transformers: tiny random Qwen 3 MoE (sparse and dense layers mixed, top-k weights
renormalized or not) and Mixtral (top 2, with and without its sliding window) checkpoints in float32, their logits
and greedy tokens, including a batch where experts receive no token and one where every token picks the same experts."""

from __future__ import annotations

import re

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from checkpoints import save_tiny, save_tiny_with_tokenizer, tiny_hf_model, write_moe_gguf
from infer import LLM, SamplingParams
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch
from infer.models.moe import SparseMLP
from infer.models.quant import Int4Experts, W8Experts

FP32_ATOL = 1e-4
CHECKPOINTS = {
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-unnormalized-step2": ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 2,
                                                   "mlp_only_layers": []}),
    "mixtral-window": ("mixtral", {}),
    "mixtral-full": ("mixtral", {"sliding_window": None}),
}


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    family, overrides = CHECKPOINTS[request.param]
    return request.param, save_tiny(family, tmp_path_factory.mktemp(request.param), **overrides)


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (3, 40, 9, 1)]


def _compare(ours, hf, prompts: list[list[int]]) -> tuple[float, float]:
    ids = torch.tensor([t for p in prompts for t in p])
    with torch.no_grad():
        logits = ours.compute_logits(ours(ids, ForwardBatch.for_prompts([len(p) for p in prompts])))
        worst = largest = 0.0
        for got, prompt in zip(logits.split([len(p) for p in prompts]), prompts):
            ref = hf(torch.tensor([prompt])).logits[0].float()
            worst, largest = max(worst, (got - ref).abs().max().item()), max(largest, ref.abs().max().item())
    return worst, largest


def test_moe_logits_fp32(checkpoint):
    name, path = checkpoint
    ours = load_model(path, torch.float32).model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    sparse = [isinstance(b.mlp, SparseMLP) for b in ours.blocks]
    want = {"qwen3_moe": [True, False, True], "qwen3_moe-unnormalized-step2": [False, True, False]}
    assert sparse == want.get(name, [True] * 3)
    diff, largest = _compare(ours, hf, _prompts(ours.config.vocab_size, seed=1))
    assert largest > 1.0 and diff <= FP32_ATOL, diff


def test_every_token_routed_to_the_same_experts(checkpoint):
    """A router that prefers experts 0 and 1 for every token: the others receive nothing; logits still match."""
    _, path = checkpoint
    ours = load_model(path, torch.float32).model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for i, block in enumerate(ours.blocks):
            if isinstance(block.mlp, SparseMLP):
                block.mlp.router[:2] += 50.0 * block.mlp.router[:2].sign()
                layer = hf.model.layers[i].mlp
                (layer.gate if hasattr(layer, "gate") else layer.router).weight.copy_(block.mlp.router)
    diff, largest = _compare(ours, hf, _prompts(ours.config.vocab_size, seed=2))
    assert largest > 1.0 and diff <= FP32_ATOL, diff


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_greedy_tokens_through_the_engine_equal_transformers(family, tmp_path):
    path = save_tiny_with_tokenizer(family, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(str(path), dtype="float32", max_seq_len=128)
    prompts = _prompts(hf.config.vocab_size, seed=3)[:3]
    outs = llm.generate_ids(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
        assert out.token_ids == want


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_gguf_as_llama_cpp_writes_it_equals_transformers(family, tmp_path):
    """A float32 GGUF with the experts stacked per projection (Mixtral as "llama" with experts, its q/k permuted and no
    window, which llama.cpp's file does not keep; every Qwen 3 MoE layer sparse, as llama.cpp's qwen3moe has them):
    the same logits as the transformers model."""
    hf = tiny_hf_model(family, **({"mlp_only_layers": []} if family == "qwen3_moe" else {"sliding_window": None}))
    path = write_moe_gguf(hf, tmp_path / f"{family}.gguf")
    ours = load_model(path, torch.float32).model
    assert ours.config.model_type == family and all(isinstance(b.mlp, SparseMLP) for b in ours.blocks)
    diff, largest = _compare(ours, hf, _prompts(ours.config.vocab_size, seed=4))
    assert largest > 1.0 and diff <= FP32_ATOL, diff


def test_speculation_prefix_caching_and_structured_output_on_moe(tmp_path):
    """The engine's features on a sparse model: n-gram speculation and prefix caching give the plain greedy tokens,
    and an output grammar holds."""
    from infer.structured import Constraint

    path = str(save_tiny_with_tokenizer("qwen3_moe", tmp_path, seed=6))
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    repeating = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [9, 10, 9, 10, 9, 10], [3, 4, 5]]
    plain = LLM(path, dtype="float32", max_seq_len=128, use_prefix_caching=False)
    want = [o.token_ids for o in plain.generate_ids(repeating, greedy)]
    speculative = LLM(path, dtype="float32", max_seq_len=128, speculative_method="ngram", num_speculative_tokens=3,
                      prompt_lookup_max=3)
    assert [o.token_ids for o in speculative.generate_ids(repeating, greedy)] == want
    cached = LLM(path, dtype="float32", max_seq_len=128, block_size=4)
    first = [o.token_ids for o in cached.generate_ids(repeating, greedy)]
    again = cached.generate_ids(repeating, greedy)
    assert first == [o.token_ids for o in again] == want and again[0].cached_tokens > 0
    out = plain.generate("The cat", SamplingParams(temperature=1.0, seed=1, max_tokens=12,
                                                   structured=Constraint("regex", r"[0-9]{3}-[a-z]{2}")))[0]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out.text)


EXPERT_KINDS = {  # the stacked experts' GGUF types -> the form they are kept in on the CPU (None: dequantized)
    "q8_0": ({"ffn_gate_exps": Q.Q8_0, "ffn_up_exps": Q.Q8_0, "ffn_down_exps": Q.Q8_0}, W8Experts),
    "q4_0-q4_1": ({"ffn_gate_exps": Q.Q4_0, "ffn_up_exps": Q.Q4_0, "ffn_down_exps": Q.Q4_1}, Int4Experts),
    "q4_0-q8_0": ({"ffn_gate_exps": Q.Q4_0, "ffn_up_exps": Q.Q4_0, "ffn_down_exps": Q.Q8_0}, None),
}
# expert sizes that split into GGUF's 32-column blocks
BLOCKED = {"qwen3_moe": {"mlp_only_layers": [], "moe_intermediate_size": 32},
           "mixtral": {"sliding_window": None, "intermediate_size": 64}}


@pytest.mark.parametrize("kinds", list(EXPERT_KINDS))
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_gguf_experts_stay_quantized_and_equal_the_dequantized_file(family, kinds, tmp_path):
    """A GGUF whose experts llama.cpp stored 4-bit or Q8_0 keeps them so on the CPU (`--quantization auto`) and its
    hidden states equal the same file dequantized at load (`none`); experts whose gate/up and down are stored in
    different forms (Q4_0 and Q8_0) are dequantized, a layer at a time."""
    expert_kinds, form = EXPERT_KINDS[kinds]
    path = write_moe_gguf(tiny_hf_model(family, **BLOCKED[family]), tmp_path / "moe.gguf", expert_kinds=expert_kinds)
    kept, dense = (load_model(path, torch.float32, quantization=q).model for q in ("auto", "none"))
    for block in kept.blocks:
        assert all(isinstance(w, form or torch.nn.Parameter) for w in (block.mlp.w13, block.mlp.w2))
    prompts = _prompts(kept.config.vocab_size, seed=7)
    ids = torch.tensor([t for p in prompts for t in p])
    with torch.no_grad():
        got, want = (m(ids, ForwardBatch.for_prompts([len(p) for p in prompts])) for m in (kept, dense))
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_quantized_experts_decode_the_dequantized_tokens_through_the_engine(tmp_path):
    """Greedy tokens of the engine (CPU decode graphs replaying the native MoE call) on 4-bit experts equal those of
    the same file dequantized, alone and in a batch."""
    directory = save_tiny_with_tokenizer("qwen3_moe", tmp_path / "model", seed=8, **BLOCKED["qwen3_moe"])
    path = write_moe_gguf(AutoModelForCausalLM.from_pretrained(directory), tmp_path / "moe.gguf", directory,
                          EXPERT_KINDS["q4_0-q4_1"][0])
    prompts = _prompts(320, seed=8)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = {}
    for quantization in ("auto", "none"):
        with LLM(str(path), max_seq_len=128, quantization=quantization) as llm:
            outs[quantization] = [o.token_ids for o in llm.generate_ids(prompts, greedy)]
            if quantization == "auto":
                assert llm.generate_ids(prompts[:1], greedy)[0].token_ids == outs["auto"][0]
                assert llm.runner.graph_stats.batch_sizes and not llm.runner.graphs.eager, llm.runner.graphs.eager
    assert outs["auto"] == outs["none"]
