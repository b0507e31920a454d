"""Structured output through the engine on tiny random models with a tokenizer of their own: constraints
hold whatever the weights say, on the CPU and (when there is one) on CUDA with decode graphs."""

from __future__ import annotations

import json
import re

import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.structured import Constraint

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module", params=DEVICES)
def llm(request, tmp_path_factory):
    path = save_tiny_with_tokenizer("llama", tmp_path_factory.mktemp("tiny"))
    return LLM(str(path), device=request.param, max_seq_len=128, max_batch_size=8)


def test_constraints_hold_for_random_weights(llm):
    regex = Constraint("regex", r"[a-z]{3}-\d{2}")
    outs = llm.generate(["The cat", "Call", "yes"], [
        SamplingParams(temperature=1.0, seed=1, max_tokens=60, structured=Constraint.json_schema(SCHEMA)),
        SamplingParams(temperature=1.0, seed=2, max_tokens=20, structured=regex),
        SamplingParams(temperature=1.0, seed=3, max_tokens=8, structured=Constraint.choice(["yes", "no", "maybe"])),
    ])
    if outs[0].finish_reason == "stop":
        assert set(json.loads(outs[0].text)) == {"name", "age"}
    assert re.fullmatch(r"[a-z]{3}-\d{2}", outs[1].text) and outs[1].finish_reason == "stop"
    assert outs[2].text in ("yes", "no", "maybe")


def test_a_bad_constraint_queues_nothing(llm):
    from infer.structured import ConstraintError

    with pytest.raises(ConstraintError):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(structured=Constraint("regex", "(["))])
    assert not llm.engine.has_unfinished()


def test_free_request_beside_a_constrained_one_is_unchanged(llm):
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate("The cat", free)[0].token_ids
    mixed = llm.generate(["The cat", "The cat"], [free, SamplingParams(temperature=0, max_tokens=12,
                                                                      structured=Constraint("regex", r"[0-9]+"))])
    assert mixed[0].token_ids == alone and re.fullmatch(r"[0-9]+", mixed[1].text)


def test_constrained_steps_overlap_with_the_same_tokens(llm, monkeypatch):
    prompts = ["The cat", "Call", "yes", "The dog"]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=24, structured=c) for s, c in enumerate([
        Constraint.json_schema(SCHEMA), Constraint("regex", r"[a-z]{3}-[0-9]{2}"), None, Constraint.choice(["yes", "no"])])]
    overlapped_masked_steps = []
    sample = llm.engine.runner.sample

    def spy(forwarded, masks):
        fed = any(r >= 0 for r in forwarded.step.prev_rows or [])
        overlapped_masked_steps.append(fed and masks is not None)
        return sample(forwarded, masks)

    monkeypatch.setattr(llm.engine.runner, "sample", spy)
    # the CPU runner launches ahead only when asked (its forward runs inside the call: nothing to overlap), as here
    monkeypatch.setattr(llm.engine.runner, "launches_ahead", True)
    overlapped = llm.generate(prompts, params)
    assert any(overlapped_masked_steps), "no masked step launched before its predecessor was read"
    monkeypatch.setattr(llm.engine.runner, "launches_ahead", False)
    synchronous = llm.generate(prompts, params)
    assert [o.token_ids for o in overlapped] == [o.token_ids for o in synchronous]
    assert [o.finish_reason for o in overlapped] == [o.finish_reason for o in synchronous]
    assert re.fullmatch(r"[a-z]{3}-[0-9]{2}", overlapped[1].text) and overlapped[3].text in ("yes", "no")
    assert llm.engine.kv.audit_blocks() == {}
