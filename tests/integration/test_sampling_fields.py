"""logit_bias, presence / frequency penalties, min_tokens and min_p through the engine (a tiny Llama with n-gram
speculation and structured output in the same batches) and through the server with the openai client."""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.structured import Constraint
from server_harness import MODEL

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_tiny_with_tokenizer("llama", tmp_path_factory.mktemp("llama") / "model", seed=2))


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    pieces = [[rng.randrange(1, 320) for _ in range(n)] for n in (5, 8, 4, 7)]
    return [p * 3 + p[:2] for p in pieces]


def _llm(path: str, **options: object) -> LLM:
    options = {"max_seq_len": 160, **options}
    return LLM(path, device="cpu", dtype="float32", max_batch_size=8, block_size=4, **options)


def _adjusted(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, seed=100 + i, max_tokens=24, presence_penalty=0.8, frequency_penalty=0.4,
                          logit_bias={7: -100, 9: 3.0}, min_tokens=6)


def test_seeded_rows_reproduce_alone_and_beside_speculation_and_grammars(tiny):
    llm = _llm(tiny, speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=3,
               speculative_disable_by_batch_size=0)
    prompts = _prompts()
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    structured = SamplingParams(temperature=1.0, seed=4, max_tokens=60, structured=Constraint.json_schema(SCHEMA))
    batch = [_adjusted(0), greedy, _adjusted(1), structured]
    together = llm.generate_ids(prompts, batch)
    alone = [llm.generate_ids([p], [q])[0] for p, q in zip(prompts, batch)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    plain = _llm(tiny).generate_ids([prompts[1]], greedy)[0]
    assert together[1].token_ids == plain.token_ids  # the speculating row is untouched by its neighbours
    assert llm.engine.scheduler.num_accepted > 0
    json.loads(together[3].text)
    for out in (together[0], together[2]):
        assert 7 not in out.token_ids and len(out.token_ids) >= 6


def test_penalties_change_sampling_and_preemption_keeps_the_counts(tiny):
    prompts = _prompts()
    params = [_adjusted(i) for i in range(len(prompts))]
    want = _llm(tiny).generate_ids(prompts, params)
    unpenalized = _llm(tiny).generate_ids(prompts, [SamplingParams(temperature=0.9, seed=100 + i, max_tokens=24)
                                                    for i in range(len(prompts))])
    assert [o.token_ids for o in want] != [o.token_ids for o in unpenalized]
    squeezed = _llm(tiny, num_kv_blocks=24, max_seq_len=64)
    got = squeezed.generate_ids(prompts, params)
    assert squeezed.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_server_fields_through_the_openai_client(client, server):
    first = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0)
    banned = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0,
                                       logprobs=1)
    token = banned.choices[0].logprobs.tokens[0]
    tokenized = httpx.post(f"{server.base_url}/tokenize", json={"prompt": token, "add_special_tokens": False}).json()
    token_id = tokenized["tokens"][0]
    other = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0,
                                      logit_bias={str(token_id): -100})
    assert first.choices[0].text == token and other.choices[0].text != token
    forced = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                       logit_bias={str(token_id): 100})
    assert forced.choices[0].text == token * 3
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "List the numbers 1 1 1 1 1 1."}], max_tokens=24,
                temperature=0)
    plain = client.chat.completions.create(**chat).choices[0].message.content
    penalised = client.chat.completions.create(**chat, frequency_penalty=2.0, presence_penalty=2.0)
    assert penalised.choices[0].message.content != plain
    seeded = dict(chat, temperature=1.0, seed=5, frequency_penalty=0.5)
    assert (client.chat.completions.create(**seeded).choices[0].message.content
            == client.chat.completions.create(**seeded).choices[0].message.content)


def test_min_tokens_holds_back_the_end(client, server):
    eos = sorted(server.state.built.tokenizer.eos_token_ids)
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, temperature=0,
                logit_bias={str(t): 100 for t in eos})
    assert client.chat.completions.create(**body).usage.completion_tokens <= 1
    held = client.chat.completions.create(**body, extra_body={"min_tokens": 5})
    assert held.usage.completion_tokens >= 5 and held.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body, extra_body={"min_tokens": 13})
    assert info.value.body["param"] == "min_tokens"


def test_min_p_offline_one_is_greedy_and_rows_reproduce_beside_speculation(tiny):
    """LLM.generate with min_p: at 1.0 (temperature 1) only the likeliest token survives, so the text is the greedy
    one, with n-gram drafts verified too; a min_p=0.1 row gives the same tokens alone and in the batch."""
    llm = _llm(tiny, speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=3,
               speculative_disable_by_batch_size=0)
    prompts = ["The quick brown fox", "Once upon a time there", "a b c a b c a b"]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    top = llm.generate(prompts, SamplingParams(temperature=1.0, min_p=1.0, seed=3, max_tokens=20, ignore_eos=True))
    assert [o.token_ids for o in top] == [o.token_ids for o in greedy]
    cut = [SamplingParams(temperature=1.3, min_p=0.1, seed=10 + i, max_tokens=20, ignore_eos=True) for i in range(3)]
    together = llm.generate(prompts, cut)
    assert [o.token_ids for o in together] == [llm.generate([p], q)[0].token_ids for p, q in zip(prompts, cut)]
    assert [o.token_ids for o in together] != [o.token_ids for o in greedy]


def test_min_p_on_both_endpoints(client, server):
    completion = dict(model=MODEL, prompt="The capital of France is", max_tokens=6)
    greedy = client.completions.create(**completion, temperature=0).choices[0].text
    top = client.completions.create(**completion, temperature=1.0, seed=7, extra_body={"min_p": 1.0})
    assert top.choices[0].text == greedy
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6)
    answer = client.chat.completions.create(**chat, temperature=0.8, seed=2, extra_body={"min_p": 0.1})
    assert answer.choices[0].message.content
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        for value in (1.5, -0.1, True, "0.1"):
            r = httpx.post(f"{server.base_url}{path}", json=body | {"min_p": value}, timeout=60)
            assert 400 <= r.status_code < 500, (path, value, r.text)
            error = r.json()["error"]
            assert error["param"] == "min_p" and "min_p" in error["message"], error
