"""`infer.LLM`: load a model once, then generate for prompts or chat conversations (offline use and the CLI)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from infer.engine.builder import BuiltEngine, Messages, build_engine
from infer.engine.config import EngineConfig
from infer.engine.request import StepOutput
from infer.sampling.params import SamplingParams

Prompt = str | list[int]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens read from the prefix cache


class LLM:
    """Offline generation: `LLM().generate(["Hello"], SamplingParams(temperature=0))`.

    Keyword arguments are `EngineConfig` fields. One caller at a time: each call drives the engine until
    its own requests finish.
    """

    def __init__(self, model: str | None = None, **engine_options: object) -> None:
        self.built: BuiltEngine = build_engine(EngineConfig(model=model, **engine_options))  # type: ignore[arg-type]
        self.engine = self.built.engine
        self.config = self.built.config
        self.tokenizer = self.built.tokenizer
        self.model_config = self.built.model_config
        self.path = self.built.path
        self.load_seconds = self.built.load_seconds
        self.runner = self.engine.runner

    # prompts -----------------------------------------------------------------------------------

    def chat_template_name(self) -> str:
        return self.built.chat_template_name()

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        return self.built.encode_chat(messages, add_generation_prompt)

    def encode(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    # generation --------------------------------------------------------------------------------

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        per_request = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_request) != len(prompts):
            raise ValueError(f"got {len(per_request)} SamplingParams for {len(prompts)} prompts")
        for ids in prompts:  # all or nothing: a bad prompt or constraint must not leave the others queued
            self.engine.validate_prompt(ids)
        for p in per_request:
            if p.structured is not None:
                self.engine.grammars.compile(p.structured)  # ConstraintError (a ValueError) names the problem
        requests = [self.engine.add_request(ids, p) for ids, p in zip(prompts, per_request)]
        errors: dict[str, str] = {}
        while self.engine.has_unfinished():
            errors |= {o.request_id: o.error for o in self.engine.step() if o.error}
        if errors:
            raise RuntimeError(f"generation failed: {errors}")
        return [
            RequestOutput(r.prompt_token_ids, r.text, r.output_token_ids, r.finish_reason, r.num_cached_tokens)
            for r in requests
        ]

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Generate for one prompt or many (text or token ids), all batched together."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        return self.generate_ids([self.encode(p) for p in prompts], params or SamplingParams())  # type: ignore[union-attr]

    def chat(self, conversations: Messages | list[Messages], params: SamplingParams | None = None) -> list[RequestOutput]:
        """Generate a reply for one conversation or many, rendered through our chat template."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        return self.generate_ids([self.encode_chat(c) for c in conversations], params or SamplingParams())  # type: ignore[arg-type]

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
        """Step outputs of one request as they are produced (text deltas safe to print)."""
        request = self.engine.add_request(prompt_ids, params)
        try:
            while not request.finished:
                for out in self.engine.step():
                    if out.request_id == request.request_id:
                        yield out
        finally:
            if not request.finished:  # the caller stopped early: free the request's blocks
                self.engine.abort(request.request_id)
                self.engine.apply_aborts()
