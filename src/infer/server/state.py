"""What every route needs: the loaded model and tokenizer, the async engine, the served model name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache

from infer.engine.async_engine import AsyncEngine
from infer.llm import LLM
from infer.server.errors import APIError


@dataclass
class ServerState:
    llm: LLM
    engine: AsyncEngine
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    def _token_text(self, token_id: int) -> str:
        return self.llm.tokenizer.decode([token_id], skip_special_tokens=False)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(422, f"model {model!r} is not served here; this server serves {self.model_name!r}", "model")

    @property
    def max_seq_len(self) -> int:
        return self.llm.config.max_seq_len

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.llm.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.llm.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            return self.llm.encode_chat(messages)
        except Exception as exc:  # a template error is about the conversation the client sent
            raise APIError(422, f"cannot render the conversation with the chat template: {exc}", "messages") from exc
