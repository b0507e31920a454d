"""What the request bodies accept: OpenAI's fields that change nothing (null too), null as the default where
OpenAI allows it, vLLM's text options, reasoning_effort as Qwen 3's thinking switch, and still a 400 for a field
nobody defines or a feature infer does not have."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infer.server.chat_request import template_arguments
from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest, CompletionRequest
from infer.server.sampling import check_supported, sampling_params

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
IGNORED = {"user": "me", "store": False, "metadata": {"run": "7"}, "service_tier": "auto",
           "prompt_cache_key": "k", "prompt_cache_retention": "24h", "safety_identifier": "hash"}
CHAT_IGNORED = {"verbosity": "low", "prediction": {"type": "content", "content": "Hello"}, "modalities": ["text"]}


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
@pytest.mark.parametrize("null", [False, True])
def test_fields_that_change_nothing_are_accepted_and_leave_the_params_alone(model, null):
    base = CHAT if model is ChatCompletionRequest else {"prompt": "Hi"}
    extra = IGNORED | (CHAT_IGNORED if model is ChatCompletionRequest else {})
    body = model.model_validate(base | {k: None if null else v for k, v in extra.items()})
    check_supported(body)
    assert sampling_params(body, 4) == sampling_params(model.model_validate(base), 4)


def test_null_means_the_default_where_openai_allows_it():
    nulls = {"temperature": None, "top_p": None, "n": None, "presence_penalty": None, "frequency_penalty": None,
             "stream": None, "logprobs": None, "min_p": None, "repetition_penalty": None}
    body = ChatCompletionRequest.model_validate(CHAT | nulls)
    assert body == ChatCompletionRequest.model_validate(CHAT)
    assert "temperature" not in body.model_fields_set  # a null is "not given" (a model's defaults may apply)


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_an_unknown_field_is_still_refused_by_name(model):
    base = CHAT if model is ChatCompletionRequest else {"prompt": "Hi"}
    with pytest.raises(ValidationError) as info:
        model.model_validate(base | {"store": True, "whatever": None})
    assert [e["loc"] for e in info.value.errors()] == [("whatever",)]
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_vllm_text_options_reach_the_sampling_params():
    body = CompletionRequest(prompt="Hi", stop=["."], skip_special_tokens=False, include_stop_str_in_output=True,
                             spaces_between_special_tokens=False)
    params = sampling_params(body, 4)
    assert params.skip_special_tokens is False and params.include_stop_str_in_output is True
    defaults = sampling_params(CompletionRequest(prompt="Hi"), 4)
    assert defaults.skip_special_tokens is True and defaults.include_stop_str_in_output is False


@pytest.mark.parametrize(("extra", "param"), [
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_features_infer_does_not_have_are_refused_by_name(extra, param):
    with pytest.raises(APIError) as info:
        check_supported(ChatCompletionRequest.model_validate(CHAT | extra))
    assert info.value.status == 400 and info.value.param == param and info.value.code == "unsupported_parameter"


@pytest.mark.parametrize(("effort", "kwargs", "expected"), [
    ("none", None, False),
    ("minimal", None, False),
    ("low", None, None),
    ("high", None, None),
    (None, None, None),
    ("none", {"enable_thinking": True}, True),  # chat_template_kwargs says it outright: it wins
    ("high", {"enable_thinking": False}, False),
])
def test_reasoning_effort_is_the_thinking_switch(effort, kwargs, expected):
    body = ChatCompletionRequest.model_validate(CHAT | {"reasoning_effort": effort, "chat_template_kwargs": kwargs})
    assert template_arguments(body, None).get("enable_thinking") == expected


def test_an_unknown_reasoning_effort_is_refused_by_name():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(CHAT | {"reasoning_effort": "extreme"})
    assert info.value.errors()[0]["loc"] == ("reasoning_effort",)


def test_generation_config_defaults_fill_only_the_fields_a_request_leaves_out():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    left_out = sampling_params(ChatCompletionRequest.model_validate(CHAT), 4, defaults=defaults)
    assert (left_out.temperature, left_out.top_p, left_out.top_k) == (0.6, 0.95, 20)
    given = sampling_params(ChatCompletionRequest.model_validate(CHAT | {"temperature": 1.0, "top_k": None}), 4,
                            defaults=defaults)
    assert (given.temperature, given.top_p, given.top_k) == (1.0, 0.95, None)  # a null top_k is vLLM's "off"
    nulled = sampling_params(CompletionRequest.model_validate({"prompt": "Hi", "temperature": None}), 4,
                             defaults=defaults)
    assert nulled.temperature == 0.6  # null is "the default", the model's here
