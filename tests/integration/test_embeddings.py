"""Embeddings: the prompt's final hidden states pooled (last, mean, cls) and L2-normalized, against transformers' last
hidden state with the same pooling in fp32 (max abs diff <= 1e-5) on a tiny Qwen 3 (prompts split into chunks, and
through a preemption) and on the bundled SmolLM2; `dimensions`; embeddings beside generation in one batch."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.loader.gguf_file import bundled_smollm2

ATOL = 1e-5
TEXTS = ["The cat sat on the mat.", "yes", "Call 555-1234 today! " * 6, '{"name": "Tom", "age": 3}']


def reference(hf, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf.model(torch.tensor([ids])).last_hidden_state[0].double()
    vector = hidden[-1] if pooling == "last" else hidden.mean(0) if pooling == "mean" else hidden[0]
    return vector / vector.norm()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = save_tiny_with_tokenizer("qwen3", tmp_path_factory.mktemp("qwen3"), seed=2)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_pooled_hidden_states_equal_transformers(qwen3, pooling):
    path, hf = qwen3
    llm = LLM(str(path), dtype="float32", max_seq_len=256, prefill_chunk_size=5, pooling=pooling)
    ids = [llm.encode(t) for t in TEXTS]
    for got, prompt in zip(llm.embed(ids), ids):
        assert (torch.tensor(got).double() - reference(hf, prompt, pooling)).abs().max().item() <= ATOL
    assert llm.engine.kv.audit_blocks() == {}


def test_a_preempted_embedding_is_pooled_once(qwen3):
    """A KV cache too small for every prompt at once: requests are preempted mid-prompt and recomputed."""
    path, hf = qwen3
    llm = LLM(str(path), dtype="float32", max_seq_len=48, prefill_chunk_size=4, num_kv_blocks=24, block_size=4,
              pooling="mean")
    ids = [llm.encode(t) for t in TEXTS * 3]
    got = llm.embed(ids)
    assert llm.engine.scheduler.num_preemptions > 0
    for vector, prompt in zip(got, ids):
        assert (torch.tensor(vector).double() - reference(hf, prompt, "mean")).abs().max().item() <= ATOL


def test_dimensions_cut_and_renormalize(qwen3):
    llm = LLM(str(qwen3[0]), dtype="float32", max_seq_len=128)
    full, cut = llm.embed("The cat")[0], llm.embed("The cat", dimensions=16)[0]
    head = torch.tensor(full[:16])
    assert len(cut) == 16 and torch.allclose(torch.tensor(cut), head / head.norm(), atol=1e-6)
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed("The cat", dimensions=len(full) + 1)


def test_embeddings_beside_generation_leave_its_tokens_unchanged(qwen3):
    llm = LLM(str(qwen3[0]), dtype="float32", max_seq_len=128)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = llm.encode("The cat sat")
    alone = llm.generate_ids([prompt], greedy)[0].token_ids
    mixed = llm.generate_ids([prompt, llm.encode("yes no maybe")], [greedy, SamplingParams(max_tokens=0, pooling="last")])
    assert mixed[0].token_ids == alone and mixed[1].embedding is not None and mixed[1].token_ids == []
    with pytest.raises(ValueError, match="max_tokens must be 0"):
        SamplingParams(max_tokens=4, pooling="last")


@pytest.mark.slow
def test_bundled_smollm2_equals_transformers():
    path = bundled_smollm2()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    llm = LLM(str(path), dtype="float32", quantization="none", max_seq_len=256)
    ids = [llm.encode(t) for t in TEXTS]
    for got, prompt in zip(llm.embed(ids), ids):
        assert (torch.tensor(got).double() - reference(hf, prompt, "last")).abs().max().item() <= ATOL
