"""What every offline LLM offers, in-process (`infer.llm.LLM`) or over data-parallel engine cores
(`infer.dp_llm.DataParallelLLM`): prompts as text, token ids or chat conversations, batched into `generate_ids`,
which each kind implements, and the outputs as `RequestOutput`s."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from infer.engine.config import EngineConfig
from infer.frontend.outputs import truncate_embedding
from infer.frontend.served import Messages, ServedModel
from infer.loader.tokenizer import Tokenizer
from infer.lora.request import LoRARequest
from infer.sampling.params import SamplingParams

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens read from the prefix cache
    probes: dict[str, list[float | None]] = field(default_factory=dict)  # per probe: a score per token_ids entry
    prompt_probes: dict[str, list[float | None]] = field(default_factory=dict)  # with probe_prompt: per prompt token
    embedding: list[float] | None = None  # with SamplingParams.pooling: the prompt's normalized embedding


class OfflineLLM(ABC):
    """The offline API over `generate_ids`: subclasses set `built` (the model's config, tokenizer and chat template)
    and `tokenizer`, and run the requests."""

    built: ServedModel
    tokenizer: Tokenizer
    config: EngineConfig

    @abstractmethod
    def close(self) -> None:
        """Release what outlives this object's memory (processes, process groups)."""

    def __enter__(self) -> OfflineLLM:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # prompts -----------------------------------------------------------------------------------

    def chat_template_name(self) -> str:
        return self.built.chat_template_name

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        return self.built.encode_chat(messages, add_generation_prompt)

    def encode(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def encode_all(self, prompts: Prompt | list[Prompt]) -> list[list[int]]:
        """One prompt or many (text or token ids) as token-id lists."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        return [self.encode(p) for p in prompts]  # type: ignore[union-attr]

    # generation --------------------------------------------------------------------------------

    @abstractmethod
    def generate_ids(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Generate for prompts of token ids, all batched together; one SamplingParams for all, or one each."""

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or many (text or token ids), all batched together; `lora_request`: the LoRA
        adapter every prompt runs, or one per prompt (None: the base model), loaded on first use."""
        ids = self.encode_all(prompts)
        return self.generate_ids(ids, self._with_adapters(params or SamplingParams(), lora_request, len(ids)))

    @abstractmethod
    def add_lora(self, name: str, path: str) -> None:
        """Load the PEFT adapter at `path` under `name` (LoRAError naming what is wrong with it; a no-op when that
        adapter is loaded already)."""

    def _with_adapters(self, params: SamplingParams | list[SamplingParams],
                       lora_request: LoRARequest | list[LoRARequest | None] | None,
                       count: int) -> SamplingParams | list[SamplingParams]:
        """Each prompt's params naming its adapter, the adapters loaded."""
        if lora_request is None:
            return params
        adapters = lora_request if isinstance(lora_request, list) else [lora_request] * count
        per_prompt = params if isinstance(params, list) else [params] * count
        if len(adapters) != count or len(per_prompt) != count:
            raise ValueError(f"got {len(adapters)} LoRA requests and {len(per_prompt)} SamplingParams for {count} "
                             "prompts")
        for adapter in {a for a in adapters if a is not None}:
            self.add_lora(adapter.lora_name, adapter.lora_path)
        return [p if a is None else replace(p, lora=a.lora_name) for p, a in zip(per_prompt, adapters)]

    def embed(self, prompts: Prompt | list[Prompt], dimensions: int | None = None) -> list[list[float]]:
        """One L2-normalized embedding per prompt (text or token ids): the final hidden states pooled as the engine's
        `pooling` says, cut to the first `dimensions` and normalized again when given."""
        params = SamplingParams(max_tokens=0, pooling=self.config.pooling)
        outputs = self.generate_ids(self.encode_all(prompts), params)
        return [truncate_embedding(o.embedding or [], dimensions) for o in outputs]

    def chat(self, conversations: Messages | list[Messages], params: SamplingParams | None = None,
             lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generate a reply for one conversation or many, rendered through our chat template."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        ids = [self.encode_chat(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate_ids(ids, self._with_adapters(params or SamplingParams(), lora_request, len(ids)))
