"""Structured output end to end on the bundled SmolLM2: offline and through the server with the openai
client; every output that finishes with `stop` is valid, the constraint never leaks to other requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from infer import SamplingParams
from infer.structured import Constraint
from server_harness import MODEL

pytestmark = pytest.mark.slow

SCHEMA_DIR = Path(__file__).parents[1] / "fixtures" / "jsonschema"
# one compilable schema per JSONSchemaBench split (all 100 run in benchmarks/structured_output.py)
SAMPLE = ["Github_trivial---o2060", "Github_easy---o6120", "Github_medium---o65706", "Glaiveai2K---calculate_area_c24ef286",
          "Kubernetes---kb_11_Normalized", "Snowplow---sp_67_Normalized", "WashingtonPost---wp_108_Normalized"]
CAT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
       "required": ["name", "age"], "additionalProperties": False}


def _ask(description: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Reply with a JSON object: {description}"}]


@pytest.mark.parametrize("name", SAMPLE)
def test_generation_under_a_schema_is_valid_when_it_stops(smollm2_llm, name):
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text())["schema"]
    out = smollm2_llm.chat(_ask(json.dumps(schema)[:1500]),
                           SamplingParams(temperature=0, max_tokens=200, structured=Constraint.json_schema(schema)))[0]
    assert out.finish_reason in ("stop", "length")
    if out.finish_reason == "stop":
        jsonschema.validate(json.loads(out.text), schema)


def test_regex_and_choice_always_match(smollm2_llm):
    for seed in range(4):
        phone = smollm2_llm.generate("Call me at", SamplingParams(temperature=1.0, seed=seed, max_tokens=16,
                                                                   structured=Constraint("regex", r" \d{3}-\d{4}")))[0]
        assert re.fullmatch(r" \d{3}-\d{4}", phone.text) and phone.finish_reason == "stop"
        pick = smollm2_llm.chat([{"role": "user", "content": "Pick a color."}],
                                SamplingParams(temperature=1.0, seed=seed, max_tokens=8,
                                               structured=Constraint.choice(["red", "green", "blue"])))[0]
        assert pick.text in ("red", "green", "blue") and pick.finish_reason == "stop"


def test_cut_by_max_tokens_reports_length(smollm2_llm):
    out = smollm2_llm.chat(_ask("a cat"), SamplingParams(temperature=0, max_tokens=3,
                                                          structured=Constraint.json_schema(CAT)))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3


def test_constrained_and_free_requests_share_a_batch(smollm2_llm):
    free = SamplingParams(temperature=0, max_tokens=24)
    alone = smollm2_llm.chat(_ask("a cat"), free)[0].text
    mixed = smollm2_llm.chat([_ask("a cat"), _ask("a cat")],
                             [free, SamplingParams(temperature=0, max_tokens=60, structured=Constraint.json_schema(CAT))])
    assert mixed[0].text == alone
    jsonschema.validate(json.loads(mixed[1].text), CAT)


def test_openai_client_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT, "strict": True}}
    whole = client.chat.completions.create(model=MODEL, messages=_ask("a cat"), temperature=0, max_tokens=60,
                                           response_format=fmt)
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), CAT)
    chunks = client.chat.completions.create(model=MODEL, messages=_ask("a cat"), temperature=0, max_tokens=60,
                                            response_format=fmt, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    obj = client.chat.completions.create(model=MODEL, messages=_ask("a dog"), temperature=0, max_tokens=120,
                                         response_format={"type": "json_object"}).choices[0]
    assert obj.message.content.startswith("{")
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.message.content), dict)


def test_text_format_is_no_constraint(client):
    plain = client.chat.completions.create(model=MODEL, messages=_ask("a cat"), temperature=0, max_tokens=20)
    text = client.chat.completions.create(model=MODEL, messages=_ask("a cat"), temperature=0, max_tokens=20,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_n_sampled_choices_all_valid(client):
    out = client.chat.completions.create(model=MODEL, messages=_ask("a cat"), temperature=1.0, seed=3, max_tokens=60,
                                         n=3, response_format={"type": "json_schema",
                                                               "json_schema": {"name": "cat", "schema": CAT}})
    for choice in out.choices:
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), CAT)


@pytest.mark.parametrize(("body", "extra"), [
    ({"prompt": "Answer:", "guided_choice": ["yes", "no"]}, {"yes", "no"}),
    ({"prompt": "Answer:", "structured_outputs": {"choice": ["yes", "no"]}}, {"yes", "no"}),
    ({"prompt": "Digits:", "guided_regex": "[0-9]{4}"}, None),
    ({"prompt": "Digits:", "structured_outputs": {"grammar": 'start: /[0-9]{4}/'}}, None),
])
def test_vllm_fields_constrain_completions(server, body, extra):
    r = httpx.post(f"{server.base_url}/v1/completions", json=body | {"max_tokens": 10, "temperature": 0}, timeout=60)
    text = r.json()["choices"][0]["text"]
    assert text in extra if extra else re.fullmatch(r"[0-9]{4}", text)


@pytest.mark.parametrize(("body", "param"), [
    ({"guided_regex": "(["}, "guided_regex"),
    ({"guided_json": {"type": "object", "not": {}}}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
])
def test_bad_constraints_are_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x", "max_tokens": 2} | body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unsupported_schema_keyword_is_named(client):
    with pytest.raises(openai.BadRequestError, match="not"):
        client.chat.completions.create(model=MODEL, messages=_ask("x"), max_tokens=2, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}})


def test_a_constraint_the_tokenizer_cannot_spell_is_a_400(server):
    """SmolLM2's byte-level vocabulary has no token for the byte 0xF1 that starts this character (found by the fuzzer)."""
    body = {"prompt": "x", "max_tokens": 8, "guided_choice": ["\x1c\xdb\xe7\U000745c8"]}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"]
    server.wait_idle()
    assert server.audit_blocks() == {}
