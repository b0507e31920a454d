"""Request bodies of the OpenAI-compatible API.

Every field is honoured; or accepted with no effect because it never changes what is generated (OpenAI's
bookkeeping fields such as `store` and `metadata`); or refused with a 400 that names it (OpenAI features infer
does not have yet, checked in `infer/server/sampling.py`); anything else is unknown, also a 400 naming it. Where
OpenAI's schema allows null for a field with a default, null means that default. The constraints here are what
`/openapi.json` publishes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from infer.sampling.logprobs import MAX_LOGPROBS
from infer.sampling.params import SEED_LIMIT

MAX_N = 16
# fields OpenAI (or vLLM) allows null for, meaning the default: a null is dropped before validation
NULL_IS_DEFAULT = frozenset({"temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "stream",
                             "echo", "logprobs", "min_p", "repetition_penalty", "min_tokens", "ignore_eos"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = Field(False, description="end the stream with a chunk carrying the request's usage")
    continuous_usage_stats: bool = Field(
        False, description="vLLM extension: every chunk carries the usage so far (prompt and completion tokens)")


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")
    description: str | None = None


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class ResponseFormat(_Body):
    type: str = Field(description="text, json_object or json_schema; any other type is a 400")
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Body):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar (Lark or GBNF), json_object."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None


class ProbeStopField(_Body):
    """End the request (finish_reason "content_filter") once probe `name` scores above `above` or below `below`."""

    name: StrictStr
    above: float | None = Field(None, allow_inf_nan=False)
    below: float | None = Field(None, allow_inf_nan=False)


class SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, description="vLLM extension; None, 0 or -1 disable it")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, strict=True,
                         description="vLLM extension: drop tokens less likely than min_p times the likeliest; 0: off")
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False, description="vLLM extension")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="vLLM extension")
    n: int = Field(1, ge=1, le=MAX_N)
    presence_penalty: float = Field(0.0, allow_inf_nan=False, description="in [-2, 2]; over generated tokens")
    frequency_penalty: float = Field(0.0, allow_inf_nan=False, description="in [-2, 2]; over generated tokens")
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100]; -100 bans it")
    min_tokens: int = Field(0, description="vLLM extension: no end of sequence before this many tokens")
    skip_special_tokens: bool = Field(True, description="vLLM extension: special tokens are left out of the text")
    spaces_between_special_tokens: bool = Field(
        True, description="vLLM extension; accepted, no effect: the tokenizers served are fast (Rust) ones, which "
                          "never put spaces between special tokens (as vLLM with a fast tokenizer)")
    include_stop_str_in_output: bool = Field(
        False, description="vLLM extension: the text ends with the stop string that ended it")
    # accepted, no effect on generation
    user: str | None = Field(None, description="an end-user identifier")
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = Field(None, description="the prefix cache needs no key: it matches prompts itself")
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    # OpenAI fields infer refuses (400) unless they leave generation unchanged; see infer/server/sampling.py.
    best_of: int | None = None
    # Structured output (infer/server/structured.py): OpenAI's response_format, vLLM's structured_outputs
    # and its older guided_* fields all become one constraint.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # Probe scores (infer serve --probes FILE; infer/server/probes.py)
    probes: StrictBool | list[StrictStr] | None = Field(
        None, description="true: every loaded probe's score per completion token; or a list of probe names")
    probe_prompt: StrictBool = Field(False, description="also a score per prompt token (prompt_probes)")
    probe_stop: ProbeStopField | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """A null where OpenAI's schema allows one (NULL_IS_DEFAULT) is the field's default."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in NULL_IS_DEFAULT}
        return data

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (stream_options.include_usage)."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk carries the usage so far (stream_options.continuous_usage_stats)."""
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class CompletionRequest(SamplingFields):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None


class ContentPart(BaseModel):
    """One part of a message's content; parts other than text are refused by the chat route, by name."""

    model_config = ConfigDict(extra="allow")  # an image part carries its own fields, refused with the part

    type: str = "text"
    text: str | None = None


class ToolCallFunction(_Body):
    name: str
    arguments: str = Field(description="the call's arguments as a JSON object in a string")


class ToolCall(_Body):
    """A call an earlier assistant turn made, sent back with the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]  # developer: OpenAI's newer name for system
    content: str | list[ContentPart] | None = None
    type: Literal["text"] | None = Field(None, description="lm-eval sends 'text' on every message; no effect")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant turn's calls")
    tool_call_id: str | None = Field(None, description="a tool turn: the call it answers")


class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON schema")
    strict: bool | None = Field(None, description="accepted; every call is generated under its schema")


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = Field(None, description="none, auto, required or a named function")
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM extension: enable_thinking (Qwen3) reaches the chat template")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="none or minimal: thinking off (Qwen3's enable_thinking=false, unless chat_template_kwargs "
                          "sets it); low to xhigh: thinking as the template's default; no effect on other models")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted, no effect")
    prediction: dict[str, Any] | None = Field(None, description="predicted output: accepted, no effect (a speed hint)")
    modalities: list[str] | None = Field(None, description="only [\"text\"]; audio output is a 400")
    audio: dict[str, Any] | None = Field(None, description="audio output: not supported (a 400 unless null)")
    web_search_options: dict[str, Any] | None = Field(None, description="web search: not supported (a 400 unless null)")


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[StrictInt]


class EmbeddingRequest(_Body):
    """OpenAI's embeddings request; `user` is accepted and ignored."""

    model: str | None = None
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(
        description="a string, a list of strings, a list of token ids, or a list of token-id lists")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="keep the first N values, normalized again")
    user: str | None = None
