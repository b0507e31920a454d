"""The API server's view of the model: its config, tokenizer and chat template, no weights."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.engine.config import EngineConfig
from infer.families.chat_template import (
    CUSTOM_TEMPLATE, ChatTemplateError, chat_template_name, load_template, load_template_file, render_template,
    template_source,
)
from infer.families.config import ModelConfig
from infer.loader.generation_config import sampling_defaults
from infer.loader.tokenizer import Tokenizer

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class ServedModel:
    """What serving needs of a model besides the engine: its config, tokenizer and chat template (the API
    server holds one of these; the engine core holds the weights)."""

    config: EngineConfig  # as built: max_seq_len bounded by the model's positions, defaults resolved
    model_config: ModelConfig
    tokenizer: Tokenizer
    path: Path

    @functools.cached_property  # read for every chat request; fixed for the model
    def chat_template_name(self) -> str:
        """The bundled chat template of this model's family, whose tool-call format and reasoning split its answers
        are read with; with a template file (`chat_template`) on a family that has none, "custom" (the Hermes
        tool-call convention)."""
        try:
            return chat_template_name(self.model_config.model_type, self.tokenizer)
        except ChatTemplateError:
            if self.config.chat_template is None:
                raise
            return CUSTOM_TEMPLATE

    @property
    def chat_template_source(self) -> str:
        """The Jinja text requests are rendered with: the `chat_template` file's, else the family's bundled one."""
        if self.config.chat_template is not None:
            return Path(self.config.chat_template).expanduser().read_text()
        return template_source(self.chat_template_name)

    @functools.cached_property
    def sampling_defaults(self) -> dict[str, float | int]:
        """The server's sampling defaults for fields a request leaves out (`generation_config`)."""
        return sampling_defaults(self.config.generation_config, self.path)

    def render_chat(self, messages: Messages, add_generation_prompt: bool = True, **template: Any) -> str:
        """`template`: tools (OpenAI tool definitions) and keyword arguments of the template (enable_thinking)."""
        if self.config.chat_template is not None:  # a file written for transformers may also read eos_token
            compiled = load_template_file(self.config.chat_template)
            template.setdefault("eos_token", self.tokenizer.eos_token or "")
        else:
            compiled = load_template(self.chat_template_name)
        return render_template(compiled, messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.tokenizer.bos_token or "", **template)

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True, **template: Any) -> list[int]:
        # the template writes BOS itself, so the tokenizer must not add another
        text = self.render_chat(messages, add_generation_prompt, **template)
        return self.tokenizer.encode(text, add_special_tokens=False)
