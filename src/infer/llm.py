"""`infer.LLM`: load a model once, then generate for prompts or chat conversations (offline use and the CLI)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from infer.dp_llm import DataParallelLLM
from infer.build.builder import BuiltEngine, build_engine
from infer.engine.config import EngineConfig
from infer.build.in_process import Engine
from infer.frontend.outputs import ProbeScores, StepOutput, probe_columns
from infer.offline import OfflineLLM, RequestOutput
from infer.sampling.params import SamplingParams
from infer.wire import ProbeInfo


class LLM(OfflineLLM):
    """Offline generation: `LLM().generate(["Hello"], SamplingParams(temperature=0))`.

    Keyword arguments are `EngineConfig` fields. One caller at a time: each call drives the engine until
    its own requests finish. With `probes="probes.yaml"`, every output carries every loaded probe's score per
    token unless its SamplingParams name the probes it wants. With `data_parallel_size=N` > 1 it returns a
    DataParallelLLM (infer/dp_llm.py): N engine-core processes, the same offline API (and an instance of LLM).
    """

    def __new__(cls, model: str | None = None, **engine_options: object) -> LLM:
        if cls is LLM and engine_options.get("data_parallel_size", 1) != 1:
            return DataParallelLLM(model, **engine_options)  # type: ignore[return-value]
        return super().__new__(cls)

    def __init__(self, model: str | None = None, **engine_options: object) -> None:
        self.built: BuiltEngine = build_engine(EngineConfig(model=model, **engine_options))  # type: ignore[arg-type]
        engine = self.built.engine
        assert isinstance(engine, Engine)
        self.engine: Engine = engine
        self.config = self.built.config
        self.tokenizer = self.built.tokenizer
        self.model_config = self.built.model_config
        self.path = self.built.path
        self.load_seconds = self.built.load_seconds
        self.runner = self.engine.runner

    def close(self) -> None:
        """Release what outlives this object's memory: a tensor-parallel engine's worker processes and process group
        (another tensor-parallel LLM in this process needs them gone)."""
        self.runner.close()

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        per_request = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_request) != len(prompts):
            raise ValueError(f"got {len(per_request)} SamplingParams for {len(prompts)} prompts")
        if self.engine.probe_layout is not None:  # offline, every loaded probe unless the params choose
            per_request = [replace(p, probes=True) if p.probes is None else p for p in per_request]
        for ids in prompts:  # all or nothing: a bad prompt, constraint or probe name must not leave the others queued
            self.engine.validate_prompt(ids)
        for p in per_request:
            self.engine.check_probes(p)
            if p.structured is not None:
                self.engine.grammars.compile(p.structured)  # ConstraintError (a ValueError) names the problem
        requests = [self.engine.add_request(ids, p, incremental_text=False) for ids, p in zip(prompts, per_request)]
        texts = {r.request_id: self.engine.text_of(r.request_id) for r in requests}
        results = {r.request_id: RequestOutput(r.prompt_token_ids, "") for r in requests}
        probe_rows: dict[str, list[ProbeScores]] = {r.request_id: [] for r in requests}
        errors: dict[str, str] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.error:
                    errors[out.request_id] = out.error
                result = results.get(out.request_id)
                if result is not None:
                    if out.probes is not None and out.token_id is not None:
                        probe_rows[out.request_id].append(out.probes)
                    if out.prompt_probes is not None:
                        result.prompt_probes = {name: list(values) for name, values in out.prompt_probes.items()}
                    if out.finished:
                        result.finish_reason = out.finish_reason
                        result.cached_tokens = out.cached_tokens
                        result.embedding = out.embedding
        if errors:
            raise RuntimeError(f"generation failed: {errors}")
        for request_id, result in results.items():
            text = texts[request_id]
            assert text is not None
            result.text, result.token_ids = text.text, text.token_ids
            result.probes = probe_columns(probe_rows[request_id])
        return list(results.values())

    def add_lora(self, name: str, path: str) -> None:
        self.engine.add_lora(name, path)

    def remove_lora(self, name: str) -> None:
        """Unload an adapter (requests already queued with it still run)."""
        self.engine.remove_lora(name)

    def list_loras(self) -> dict[str, str]:
        """The loaded adapters: name -> path."""
        return {ref.name: ref.path for ref in self.engine.lora_adapters()}

    def probes(self) -> list[ProbeInfo]:
        """The loaded probes (empty without a probe set)."""
        catalog = self.engine.probe_catalog
        return list(catalog.probes) if catalog is not None else []

    def reload_probes(self) -> list[ProbeInfo]:
        """Re-read the configured probe-set file and swap its weights in (ProbeError: the old set stays)."""
        self.engine.swap_probes(self.built.read_probe_set())
        return self.probes()

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StepOutput]:
        """Step outputs of one request as they are produced (text deltas safe to print)."""
        request = self.engine.add_request(prompt_ids, params)
        finished = False
        try:
            while not finished:
                for out in self.engine.step():
                    if out.request_id == request.request_id:
                        finished = out.finished
                        yield out
        finally:
            if not request.finished:  # the caller stopped early, or a stop string ended it: free its blocks
                self.engine.abort(request.request_id)
                self.engine.apply_aborts()


LLM.register(DataParallelLLM)  # isinstance(LLM(data_parallel_size=2), LLM), as LLM(...) returns it
