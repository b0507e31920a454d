"""The server under inputs a new user's clients send: every one gets a 2xx or an OpenAI-shaped 4xx,
nothing unsupported is silently ignored, and the openai client's model and role calls work."""

from __future__ import annotations

import json
import logging
import time

import httpx
import openai
import pytest

from server_harness import MODEL

pytestmark = pytest.mark.slow


def _post(server, path: str, body: dict | str | bytes) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(f"{server.base_url}{path}", content=content, headers={"content-type": "application/json"},
                      timeout=120)


def _error(r: httpx.Response, status: int) -> dict:
    """The OpenAI error object of a response that must have `status`."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


CHAT = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 1}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "a\\ud800b"], "max_tokens": 1}', "prompt.1"),
    ("/tokenize", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 1}',
     "messages.0.content"),
])
def test_lone_surrogate_is_a_400_naming_the_field(server, path, raw, param):
    assert _error(_post(server, path, raw), 400)["param"] == param


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"prompt": "Hello", "max_tokens": 4, "stop": ["\\ud800"]}', "stop.0"),
    ("/v1/completions", '{"prompt": "Hello", "max_tokens": 4, "stop": "x\\udfff", "stream": true}', "stop"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, '
                             '"stop": ["ok", "\\ud800"]}', "stop.1"),
])
def test_a_stop_string_with_a_lone_surrogate_fails_alone(server, path, raw, param):
    for _ in range(3):
        assert _error(_post(server, path, raw), 400)["param"] == param
    assert _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2}).status_code == 200
    assert server.state.engine.num_waiting == 0 and server.call("idle")


def test_a_request_that_cannot_be_encoded_fails_alone_and_is_never_counted(server, monkeypatch):
    """Past the field checks (here switched off), the wire's own encoding refuses the request by its field; the
    requests before and after it are untouched and nothing stays counted as waiting."""
    monkeypatch.setattr("infer.server.sampling.check_text", lambda text, param: text)
    for _ in range(3):
        err = _error(_post(server, "/v1/completions", '{"prompt": "Hello", "max_tokens": 4, "stop": ["\\ud800"]}'), 400)
        assert err["param"] == "stop"
    for stream in (False, True):
        assert _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "stream": stream}).status_code == 200
    assert server.state.engine.num_waiting == 0 and server.call("idle")


@pytest.mark.parametrize(("path", "param"), [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages"),
                                             ("/tokenize", "prompt")])
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(server, monkeypatch, path, param):
    """Past max_seq_len x the most characters a token covers, no tokenization can fit: refused without running the
    tokenizer (whose memory grows ~250x with its input)."""
    calls = []
    tokenizer = server.state.built.tokenizer
    monkeypatch.setattr(tokenizer, "encode", lambda *a, **k: calls.append(a) or [])
    text = "a" * (server.state.max_prompt_chars + 1)
    body = {"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text}
    err = _error(_post(server, path, body if path == "/tokenize" else {**body, "max_tokens": 1}), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == param and "characters" in err["message"]
    assert calls == []


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deeply_nested_tool_call_arguments_are_a_400(server, depth):
    arguments = '{"a": ' + "[" * depth + "]" * depth + "}"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 1}
    err = _error(_post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == "messages.1.tool_calls.0.function.arguments" and "nested" in err["message"]
    assert _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("prompt", [[1, 96029485282826], [1, -5]])
def test_echo_of_an_out_of_vocabulary_id_is_refused_before_decoding(server, prompt):
    err = _error(_post(server, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 1}), 422)
    assert err["param"] == "prompt" and "vocabulary" in err["message"]


def test_more_parts_than_the_queue_holds_is_a_400_and_queues_nothing(server):
    bound = server.state.engine.max_waiting_requests
    err = _error(_post(server, "/v1/completions", {"prompt": ["hi"] * (bound + 44), "max_tokens": 1}), 400)
    assert str(bound) in err["message"]
    assert server.state.engine.num_waiting == 0 and server.call("idle")


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**9}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 16384}),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 1024}),
])
def test_max_tokens_beyond_the_context_is_a_400(server, path, body):
    err = _error(_post(server, path, body), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert f"maximum context length is {server.state.max_seq_len} tokens" in err["message"]


def test_prompt_that_fills_the_context_is_a_400(server):
    err = _error(_post(server, "/v1/completions", {"prompt": [1] * server.state.max_seq_len, "max_tokens": 1}), 400)
    assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"logit_bias": {"1": 500}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"999999": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"token": 5}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"\u00b2": 5}}, "logit_bias"),  # a digit to str.isdigit, not to int()
    ("/v1/completions", {"logit_bias": {"9" * 5000: 5}}, "logit_bias"),  # past int()'s digit limit
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"min_tokens": 4}, "min_tokens"),
    ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search"),  # a vLLM field infer does not know
    ("/v1/completions", {"store": False, "stop_token_ids": None}, "stop_token_ids"),  # unknown even when null
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("/v1/chat/completions", {"web_search_options": {}}, "web_search_options"),
])
def test_unsupported_fields_are_refused_by_name(server, path, extra, param):
    body = ({"messages": CHAT} if "chat" in path else {"prompt": "Hi"}) | {"max_tokens": 2} | extra
    err = _error(_post(server, path, body), 400)
    assert err["param"] == param and param in err["message"]


def test_fields_that_change_nothing_are_accepted(client):
    text = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0).choices[0].message.content
    same = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0, user="me",
                                          response_format={"type": "text"}, tool_choice="none")
    assert same.choices[0].message.content == text


OPENAI_BOOKKEEPING = {"store": False, "metadata": {"run": "7"}, "service_tier": "auto", "user": "me",
                      "prompt_cache_key": "k", "safety_identifier": "hash", "prompt_cache_retention": None}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_fields_that_change_nothing_are_accepted_and_ignored(server, path):
    body = ({"messages": CHAT} if "chat" in path else {"prompt": "Hi"}) | {"max_tokens": 6, "temperature": 0}
    plain = _post(server, path, body)
    chat = {"reasoning_effort": "low", "verbosity": "medium", "modalities": ["text"]} if "chat" in path else {}
    same = _post(server, path, body | OPENAI_BOOKKEEPING | chat | {"top_p": None, "n": None})
    assert plain.status_code == same.status_code == 200, same.text
    text = (lambda r: r.json()["choices"][0].get("text") or r.json()["choices"][0]["message"]["content"])
    assert text(same) == text(plain)


def test_include_stop_str_in_output_ends_the_text_with_the_stop(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0)
    kept = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"],
                                     extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].text == free.choices[0].text[: free.choices[0].text.index(" 7") + 2]


def test_skip_special_tokens_false_shows_the_end_of_turn_token(client):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=60,
               temperature=0)
    shown = client.chat.completions.create(**ask, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    hidden = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert "<|im_end|>" in shown.choices[0].message.content
    assert "<|im_end|>" not in hidden.choices[0].message.content


def test_an_unknown_route_is_a_404_naming_it(server):
    err = _error(httpx.post(f"{server.base_url}/v1/chat/complete", json={}), 404)
    assert err["message"].startswith("Invalid URL (POST /v1/chat/complete)")


def test_models_retrieve_and_unknown_model_is_404_model_not_found(client, server):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT, max_tokens=1)
    assert _error(_post(server, "/v1/completions", {"model": "gpt-4", "prompt": "Hi"}), 404)["param"] == "model"


def test_developer_role_is_the_system_role(client):
    def reply(role: str) -> str:
        messages = [{"role": role, "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0).choices[0].message.content

    assert reply("developer") == reply("system")


def test_created_is_the_time_of_each_response(client):
    time.sleep(1.1)  # the server started at least a second ago: its start time would now be in the past
    before = int(time.time())
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream=True))
    assert before <= out.created <= time.time()
    assert {c.created for c in chunks} == {chunks[0].created} and chunks[0].created >= before


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/no/such/route", None, 404),
    ("GET", "/v1/completions", None, 405),
    ("POST", "/v1/completions", "{not json", 400),
    ("POST", "/v1/completions", "[" * 100_000 + "]" * 100_000, 400),
    ("POST", "/v1/completions", b"\xff\xfe{\x00", 400),
    ("POST", "/v1/completions", '{"prompt": "Hi", "\\ud800": 1}', 400),
])
def test_every_failure_has_an_openai_error_body(server, method, path, body, status):
    r = httpx.request(method, f"{server.base_url}{path}", content=body, headers={"content-type": "application/json"})
    _error(r, status)


def test_unexpected_exception_is_a_500_logged_once_and_serving_goes_on(server, monkeypatch, caplog):
    def broken(model: str | None) -> None:
        raise RuntimeError("planted bug")

    monkeypatch.setattr(server.state, "check_model", broken)
    with caplog.at_level(logging.ERROR):
        err = _error(_post(server, "/tokenize", {"prompt": "Hi"}), 500)
    monkeypatch.undo()
    assert "RuntimeError" in err["message"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert _post(server, "/tokenize", {"prompt": "Hi"}).status_code == 200


def test_client_disconnect_is_one_info_line(server, caplog):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True}
    with caplog.at_level(logging.INFO, logger="infer.server"):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=1.0)
        server.wait_idle()
        time.sleep(0.5)  # the handler logs once it has seen the disconnect (it polls every 0.2 s)
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("client disconnected" in r.getMessage() for r in caplog.records)
    assert server.audit_blocks() == {}


def test_tokenizer_info_carries_the_chat_template(server):
    info = httpx.get(f"{server.base_url}/tokenizer_info").json()
    assert "<|im_start|>" in info["chat_template"] and "messages" in info["chat_template"]


def test_openapi_describes_the_server(server):
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "404", "422", "500", "503"} <= set(completions)
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    schemas = doc["components"]["schemas"]
    assert schemas["ChatMessage"]["properties"]["role"]["enum"] == ["system", "developer", "user", "assistant", "tool"]
    completion = schemas["CompletionRequest"]["properties"]
    assert completion["model"]["anyOf"][0]["enum"] == [MODEL]
    assert completion["max_tokens"]["anyOf"][0]["maximum"] == server.state.max_seq_len - 1
    assert '"maximum": %d' % (server.state.vocab_size - 1) in json.dumps(completion["prompt"])
    assert "/v1/models/{model_id}" in doc["paths"]
