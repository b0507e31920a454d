"""The engine end to end on the bundled SmolLM2: finish reasons, stop strings, streaming, seeds, batching."""

from __future__ import annotations

import pytest

from infer import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,"]


def test_max_tokens_gives_length(smollm2_llm):
    out = smollm2_llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_eos_gives_stop_and_is_not_in_text(smollm2_llm):
    out = smollm2_llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=64))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] in smollm2_llm.tokenizer.eos_token_ids
    assert "<|im_end|>" not in out.text


def test_stop_string_truncates_and_finishes(smollm2_llm):
    free = smollm2_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    assert " 7" in free.text
    cut = smollm2_llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=24, stop=[" 7"]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(" 7")]


def test_streamed_deltas_add_up_to_the_final_text(smollm2_llm):
    ids = smollm2_llm.encode("Emoji party: 🎉🎈 and café au lait, 東京")
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, stop=["\n\n"])
    outs = list(smollm2_llm.stream(ids, params))
    assert sum(o.finished for o in outs) == 1 and outs[-1].finished
    again = smollm2_llm.generate_ids([ids], params)[0]
    assert "".join(o.text_delta for o in outs) == again.text
    assert "\ufffd" not in again.text or "\ufffd" in smollm2_llm.tokenizer.decode(again.token_ids)


def test_seeded_request_is_independent_of_its_batch(smollm2_llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, ignore_eos=True)
    alone = smollm2_llm.generate("Tell me about the ocean.", seeded)[0]
    others = [SamplingParams(temperature=t, top_k=k, seed=s, max_tokens=n)
              for t, k, s, n in [(0.7, 20, 1, 8), (0.0, None, None, 30), (1.3, 5, 2, 16), (1.0, None, None, 24)]]
    batch = smollm2_llm.generate(
        ["Hi", "Tell me about the ocean.", "Write a list:", "Why?", "Tell me about the ocean."],
        [others[0], seeded, others[1], others[2], others[3]],
    )
    assert batch[1].token_ids == alone.token_ids
    assert batch[4].token_ids != alone.token_ids  # unseeded: drawn from the engine's own generator


def test_batched_greedy_equals_one_by_one(smollm2_llm):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    batched = smollm2_llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, batched):
        assert smollm2_llm.generate(prompt, params)[0].token_ids == out.token_ids
    assert smollm2_llm.engine.kv.audit_blocks() == {}


def _repeats(prompt: list[int], output: list[int]) -> int:
    seen, count = set(prompt), 0
    for token in output:
        count += token in seen
        seen.add(token)
    return count


def test_repetition_penalty_discourages_repeats(smollm2_llm):
    prompt = "la la la la la"
    plain = smollm2_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    penalised = smollm2_llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
    )[0]
    assert _repeats(penalised.prompt_token_ids, penalised.token_ids) < _repeats(plain.prompt_token_ids, plain.token_ids)


def test_bad_inputs_fail_clearly(smollm2_llm):
    with pytest.raises(ValueError, match="empty"):
        smollm2_llm.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="max_seq_len"):
        smollm2_llm.generate([[1] * 2000], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    assert not smollm2_llm.engine.has_unfinished()
