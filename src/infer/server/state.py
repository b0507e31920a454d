"""What every route needs: the served model's tokenizer and config, the engine client, the served model name,
and the checks that turn a bad prompt into a 4xx before anything is decoded or queued."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from infer.frontend.served import ServedModel
from infer.frontend.client import EngineClient
from infer.frontend.dp_client import DPClient
from infer.server.errors import APIError
from infer.server.limits import LARGE_TEXT_CHARS, ServerLimits
from infer.server.responses_store import ResponseStore
from infer.server.workers import Workers
from infer.structured import GrammarCompiler


@dataclass
class ServerState:
    built: ServedModel
    engine: EngineClient | DPClient  # DPClient with --data-parallel-size > 1
    model_name: str
    api_server_index: int = 0  # which of `--api-server-count` processes this is
    created: int = field(default_factory=lambda: int(time.time()))  # the model card's creation time
    limits: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        self.token_text = lru_cache(maxsize=65536)(self._token_text)
        self.token_bytes = lru_cache(maxsize=65536)(self.built.tokenizer.token_bytes)
        # this process's own compiler: a constraint is checked here (400) before the core compiles it again
        self.grammars = GrammarCompiler(self.built.tokenizer, self.vocab_size)
        self.grammars.prepare()  # before this API server serves (see GrammarCompiler.prepare); the core warns once
        self.workers = Workers(self.built.config.structured_compile_timeout_s)
        # the most characters a prompt that fits the context can have (read once: 0.26 s for a 262k vocabulary)
        self.max_prompt_chars = self.max_seq_len * self.built.tokenizer.max_chars_per_token
        self.responses = ResponseStore(self.limits.responses_store_size)  # /v1/responses stored in this process

    def _token_text(self, token_id: int) -> str:
        return self.built.tokenizer.decode([token_id], skip_special_tokens=False)

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model); 404 for a model not served here."""
        if model is None or model == self.model_name:
            return None
        if model in self.engine.loras:
            return model
        served = ", ".join(repr(n) for n in [self.model_name, *self.engine.loras])
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served}", "model",
                       "model_not_found")

    def answered_by(self, model: str | None) -> str:
        """The `model` a response names: the adapter the request ran (checked by `check_model`), else the base."""
        return model or self.model_name

    @property
    def max_seq_len(self) -> int:
        return self.built.config.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.engine.info.vocab_size

    @property
    def chat_template(self) -> str | None:
        """The Jinja source of the chat template the server renders with, or None (a base model)."""
        try:
            return self.built.chat_template_source
        except ValueError:
            return None

    def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        self.check_prompt_chars(len(text), param)
        return self.built.tokenizer.encode(check_text(text, param), add_special_tokens=add_special_tokens)

    def check_prompt_chars(self, chars: int, param: str) -> None:
        """400 context_length_exceeded, before tokenizing, for text longer than the context can hold even at the
        most characters a token covers: the tokenizer's memory grows ~250x with its input."""
        limit = self.max_prompt_chars
        if chars > limit:
            raise APIError(400, f"This model's maximum context length is {self.max_seq_len} tokens. However, your "
                                f"prompt has {chars} characters, more than {self.max_seq_len} tokens can hold "
                                f"(at most {limit}). Please shorten the prompt.", param, "context_length_exceeded")

    async def encode_async(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """`encode`, on a worker thread for large text: a long prompt never holds the other requests' streams."""
        if len(text) <= LARGE_TEXT_CHARS:
            return self.encode(text, param, add_special_tokens)
        return await self.workers.run(self.encode, text, param, add_special_tokens)

    async def encode_many_async(self, texts: list[tuple[str, str]]) -> list[list[int]]:
        """`encode` of each (text, param), on one worker thread call when their text is large in all."""
        if sum(len(text) for text, _ in texts) <= LARGE_TEXT_CHARS:
            return [self.encode(text, param) for text, param in texts]
        return await self.workers.run(lambda: [self.encode(text, param) for text, param in texts])

    async def encode_chat_async(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                                template: dict[str, Any] | None = None) -> list[int]:
        """`encode_chat`, on a worker thread for large conversations: every part of a message counts (content,
        tool calls and their arguments) and the template's arguments (tool definitions)."""
        if sum(len(str(m)) for m in messages) + len(str(template or "")) <= LARGE_TEXT_CHARS:
            return self.encode_chat(messages, add_generation_prompt, template)
        return await self.workers.run(self.encode_chat, messages, add_generation_prompt, template)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.built.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    template: dict[str, Any] | None = None) -> list[int]:
        """`template`: the chat template's extra arguments (tools, enable_thinking)."""
        for i, m in enumerate(messages):
            check_text(m["content"], f"messages.{i}.content")
        self.check_prompt_chars(sum(len(m["content"]) for m in messages), "messages")
        try:
            return self.built.encode_chat(messages, add_generation_prompt, **(template or {}))
        except Exception as exc:  # a template error is about the conversation the client sent
            raise APIError(422, f"cannot render the conversation with the chat template: {exc}", "messages") from exc

    def check_token_ids(self, ids: list[int], param: str) -> None:
        """Every id inside the vocabulary (422): checked before an id is decoded or queued."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(422, f"token id {bad} in {param} is outside the vocabulary [0, {self.vocab_size})", param)

    def check_context(self, prompt_tokens: int, max_tokens: int | None, param: str) -> None:
        """400 context_length_exceeded when the prompt, or the prompt plus max_tokens, does not fit the context."""
        limit = self.max_seq_len
        if prompt_tokens >= limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, your prompt has "
                                f"{prompt_tokens} tokens, which leaves no room to generate. Please shorten the prompt.",
                           param, "context_length_exceeded")
        if max_tokens is not None and prompt_tokens + max_tokens > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
                                f"in the completion). Please reduce the length of the prompt or of max_tokens.",
                           "max_tokens", "context_length_exceeded")

    def check_parts(self, parts: int) -> None:
        """A request with more parts (prompts x n) than the waiting queue can ever hold is a 400, not a 503."""
        bound = self.engine.max_waiting_requests
        if parts > bound:
            raise APIError(400, f"this request needs {parts} sequences (prompts x n), more than the server queues "
                                f"at once ({bound}); split it into smaller requests", "prompt")


def check_text(text: str, param: str) -> str:
    """Text that is valid Unicode: a lone UTF-16 surrogate (JSON allows "\\ud800") is a 400 naming the field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"{param} is not valid Unicode: a lone surrogate at character {exc.start}", param) from exc
    return text
