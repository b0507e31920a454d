"""`infer.LLM`: load a model once, then generate for prompts or chat conversations (offline use and the CLI)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from infer.engine.config import EngineConfig
from infer.engine.engine import Engine
from infer.engine.request import StepOutput
from infer.kv.kv_manager import KVCacheManager
from infer.kv.sizing import kv_layout
from infer.loader.gguf_loader import bundled_smollm2
from infer.loader.model_loader import load_model
from infer.loader.tokenizer import Tokenizer
from infer.models.chat_template import ChatTemplateError, TEMPLATE_DIR, render_chat
from infer.models.registry import model_spec
from infer.runners.cuda_graphs import bucket_sizes
from infer.runners.torch_runner import TorchRunner
from infer.sampling.params import SamplingParams

Prompt = str | list[int]
Messages = list[dict[str, str]]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def resolve_model_path(model: str | None) -> Path:
    """None means the bundled SmolLM2-135M-Instruct GGUF."""
    return bundled_smollm2() if model is None else Path(model).expanduser()


def chat_template_name(model_type: str, tokenizer: Tokenizer) -> str:
    """The bundled chat template for a model family whose tokenizer has the template's marker token."""
    for name, marker in model_spec(model_type).chat_templates:
        if tokenizer.has_token(marker):
            return name
    raise ChatTemplateError(
        f"no chat template for this {model_type} tokenizer; "
        f"add one to {TEMPLATE_DIR} and register it in infer/models/registry.py"
    )


class LLM:
    """Offline generation: `LLM().generate(["Hello"], SamplingParams(temperature=0))`.

    One caller at a time: each call drives the engine until its own requests finish.
    """

    def __init__(self, model: str | None = None, **engine_options: object) -> None:
        self.config = EngineConfig(model=model, **engine_options)  # type: ignore[arg-type]
        self.path = resolve_model_path(model)
        started = time.perf_counter()
        loaded = load_model(self.path, self.config.torch_dtype, self.config.resolved_device, self.config.max_seq_len,
                            self.config.load_format)
        self.model_config = loaded.config
        self.tokenizer = Tokenizer.from_path(self.path)
        self.config = replace(self.config, max_seq_len=min(self.config.max_seq_len, loaded.config.max_position_embeddings))
        layout = kv_layout(
            loaded.config, self.config.torch_dtype, self.config.kv_cache_backend, self.config.block_size,
            self.config.max_seq_len, self.config.max_batch_size, self.config.num_kv_blocks,
            self.config.kv_cache_memory_gb * 2**30,
        )
        self.runner = TorchRunner(
            loaded.model, layout.num_blocks, layout.block_size, self.config.max_batch_size,
            self.config.max_seq_len, bucket_sizes(self.config.max_batch_size) if self.config.cuda_graphs else (),
        )
        self.engine = Engine(self.config, self.runner, KVCacheManager(*layout), self.tokenizer)
        self.load_seconds = time.perf_counter() - started  # weights loaded, cache allocated, graphs captured

    # prompts -----------------------------------------------------------------------------------

    def chat_template_name(self) -> str:
        return chat_template_name(self.model_config.model_type, self.tokenizer)

    def render_chat(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        return render_chat(self.chat_template_name(), messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.tokenizer.bos_token or "")

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        # the template writes BOS itself, so the tokenizer must not add another
        return self.tokenizer.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)

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
            RequestOutput(r.prompt_token_ids, r.text, r.output_token_ids, r.finish_reason) for r in requests
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
