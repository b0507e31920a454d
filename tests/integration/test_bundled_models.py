"""The bundled GGUF models end to end: greedy tokens vs transformers (SmolLM2), logits parity (Gemma 3)."""

from __future__ import annotations

import pytest
import torch

from infer import LLM, SamplingParams
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Give me three tips for writing clean Python code."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
# Measured here: max |logit diff| on the prompts below is ~1e-4 with logits up to ~40 (fp32 on both sides;
# the 270M model's 18 layers and 262k-row tied head accumulate float rounding differently).
GEMMA_LOGIT_ATOL = 2e-3


@pytest.fixture(scope="module")
def smollm2(smollm2_llm):
    return smollm2_llm


def test_smollm2_greedy_matches_transformers_token_for_token(smollm2_gguf, hf_smollm2):
    """Dequantized (quantization="none"): the same float32 weights as transformers' GGUF loader."""
    hf = hf_smollm2
    smollm2 = LLM(str(smollm2_gguf), max_seq_len=1024, quantization="none")
    prompts = [smollm2.encode_chat(c) for c in CHATS]
    ours = smollm2.generate_ids(prompts, SamplingParams(temperature=0.0, max_tokens=64))
    with torch.no_grad():
        for prompt, out in zip(prompts, ours):
            ref = hf.generate(
                torch.tensor([prompt]), max_new_tokens=64, do_sample=False,
                # transformers maps SmolLM2's GGUF EOS to <|im_start|>; stop where the model really ends a turn
                eos_token_id=sorted(smollm2.tokenizer.eos_token_ids),
            )[0, len(prompt):].tolist()
            assert out.token_ids == ref
            assert len(ref) >= 8
    assert smollm2.engine.kv.audit_blocks() == {}


def test_smollm2_knows_the_capital_of_france(smollm2):
    out = smollm2.chat(CHATS[0], SamplingParams(temperature=0.0, max_tokens=32))[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


def test_gemma3_270m_logits_parity(gemma3_gguf, hf_gemma3):
    ours = load_model(gemma3_gguf, torch.float32).model
    hf = hf_gemma3
    from infer.loader.tokenizer import Tokenizer

    tok = Tokenizer.from_path(gemma3_gguf)
    for text in ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of", "1, 2, 3, 4,"]:
        ids = tok.encode(text)
        with torch.no_grad():
            got = ours.compute_logits(ours(torch.tensor(ids), ForwardBatch.for_prompts([len(ids)])))
            ref = hf(torch.tensor([ids])).logits[0].float()
        assert (got - ref).abs().max().item() <= GEMMA_LOGIT_ATOL
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
