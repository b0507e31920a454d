"""Engine: the engine core and the text processor in the caller's process (offline `LLM`, the CLI, tests).

`infer serve` runs the core in its own process instead (core_process.py) and the same text processor
beside the API (client.py); this class is the in-process pairing of the two, so both paths share one
implementation of each. step() returns the caller's StepOutputs, text included.
"""

from __future__ import annotations

from infer.engine.config import EngineConfig
from infer.lora.registry import LoRARegistry
from infer.engine.core import EngineCore
from infer.engine.request import Request
from infer.frontend.outputs import StepOutput
from infer.frontend.text import TextProcessor, TextState
from infer.kv.kv_manager import KVCacheManager
from infer.loader.tokenizer import Tokenizer
from infer.runners.base import Runner
from infer.sampling.params import SamplingParams


class Engine(EngineCore):
    """An EngineCore whose outputs are detokenized and stop-checked here, as the API server does."""

    def __init__(self, config: EngineConfig, runner: Runner, kv: KVCacheManager, tokenizer: Tokenizer,
                 loras: LoRARegistry | None = None) -> None:
        super().__init__(config, runner, kv, tokenizer, loras)
        self.text = TextProcessor(tokenizer)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    incremental_text: bool = True) -> Request:
        """Queue a request; `incremental_text=False` when only its final text is read (TextProcessor.add)."""
        request = super().add_request(prompt_token_ids, params, request_id)
        self.text.add(request.request_id, request.prompt_token_ids, params, request.probe_names, incremental_text)
        return request

    def text_of(self, request_id: str) -> TextState | None:
        """A running request's text so far (None once it has ended: keep what `add_request`'s TextState said)."""
        return self.text.states.get(request_id)

    def step(self) -> list[StepOutput]:
        """One engine step; a request whose text hit a stop string ends in the core at the next step."""
        outputs = self.text.process_step(self.step_core())
        for request_id in self.text.take_stopped():
            self.abort(request_id, "stop")
        return outputs
