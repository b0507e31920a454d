"""`LLM(data_parallel_size=N)`: offline generation over N engine-core processes, as `infer serve -dp N` runs them.

`LLM(...)` with data_parallel_size > 1 returns one of these (a virtual subclass of LLM). It starts the cores once
(build/dp_cores.py) and drives each `generate` through a DPClient (frontend/dp_client.py) on a private event loop:
every prompt is routed by `load_balance_method`, each core batches what it got, and the outputs come back in the
prompts' order. Detokenization and stop strings run here, as in the API server. Not offered with DP: probes and
`stream` (use `infer serve -dp N` for either). The cores stop with `close()`, or when the LLM is collected or the
interpreter exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from dataclasses import replace
from collections.abc import AsyncIterator
from pathlib import Path

from infer.frontend.client import RequestStream
from infer.engine.config import EngineConfig
from infer.build.core_process import CoreProcess
from infer.frontend.dp_client import DPClient
from infer.frontend.served import ServedModel
from infer.heap import settle_heap
from infer.build.dp_cores import start_cores
from infer.loader.tokenizer import Tokenizer
from infer.offline import OfflineLLM, RequestOutput
from infer.sampling.params import SamplingParams

OFFLINE_QUEUE = 1 << 30  # offline, every prompt is queued at once: no admission limit
SEND_EVERY = 64  # prompts sent to the cores together (1,024 prompts took ~65 ms to encode on an H200's host)


class DataParallelLLM(OfflineLLM):
    def __init__(self, model: str | None = None, **engine_options: object) -> None:
        config = EngineConfig(model=model, **engine_options)  # type: ignore[arg-type]
        if config.probes is not None:
            raise ValueError("probes: not supported offline with data_parallel_size > 1; "
                             "use `infer serve --data-parallel-size N --probes FILE`")
        self.cores: list[CoreProcess] = start_cores(config)
        self._stop = weakref.finalize(self, _stop_all, self.cores)
        self.infos = [core.info for core in self.cores]
        info = self.infos[0]
        # the tokenizer and chat template, no weights
        self.built = ServedModel(info.config, info.model_config, Tokenizer.from_path(Path(info.model_path)),  # type: ignore[assignment]
                                 Path(info.model_path))
        self.config = replace(self.built.config, data_parallel_size=config.data_parallel_size)
        self.tokenizer = self.built.tokenizer
        self.model_config = self.built.model_config
        self.path = self.built.path
        self.load_seconds = max(info.load_seconds for info in self.infos)  # they load concurrently
        self._ids = itertools.count()
        self._loras: dict[str, str] = dict(self.config.lora_modules or {})  # loaded in every core
        # this process now receives every engine's tokens: a full collection over what start-up left (torch, the
        # tokenizer) stalled a 1,024-prompt burst ~0.4 s on 2 x H200 (docs/distributed.md, data parallelism)
        settle_heap()

    def close(self) -> None:
        """Stop the engine cores (also done when the LLM is collected or at exit)."""
        self._stop()

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        per_request = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_request) != len(prompts):
            raise ValueError(f"got {len(per_request)} SamplingParams for {len(prompts)} prompts")
        return asyncio.run(self._generate(prompts, per_request))

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[DPClient]:
        """A client of every engine core, for one call's life."""
        client = DPClient(self.infos, self.tokenizer, OFFLINE_QUEUE, None, self.config.load_balance_method)
        await client.start()
        try:
            yield client
        finally:
            await client.close()

    async def _generate(self, prompts: list[list[int]], per_request: list[SamplingParams]) -> list[RequestOutput]:
        async with self._client() as client:
            streams = []
            try:  # all or nothing: a bad prompt must not leave the others queued
                for i, (ids, p) in enumerate(zip(prompts, per_request), 1):
                    # only the final text is read: decoded once at the end, not per token (TextProcessor.add)
                    streams.append(client.submit(f"offline-{next(self._ids)}", ids, p, incremental_text=False))
                    if i % SEND_EVERY == 0:  # the cores start on these while the rest are encoded
                        client.flush()
            except BaseException:
                for stream in streams:
                    client.abort(stream.request_id)
                raise
            results = await asyncio.gather(*(_collect(s, ids) for s, ids in zip(streams, prompts)))
        errors = {s.request_id: error for s, (_, error) in zip(streams, results) if error}
        if errors:
            raise RuntimeError(f"generation failed: {errors}")
        return [result for result, _ in results]

    def add_lora(self, name: str, path: str) -> None:
        """Load the adapter in every engine core (the first core's refusal, a RuntimeError, names the problem)."""
        if name not in self._loras or self._loras[name] != path:
            asyncio.run(self._call("load_lora", name, path))
            self._loras[name] = path

    async def _call(self, method: str, *args: str) -> object:
        async with self._client() as client:
            return await client.call(method, *args)

    def stream(self, prompt_ids: list[int], params: SamplingParams):  # type: ignore[no-untyped-def]
        raise NotImplementedError("LLM.stream is not offered with data_parallel_size > 1; use infer serve -dp N")

    def reload_probes(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError("probes: not supported offline with data_parallel_size > 1")

    def probes(self):  # type: ignore[no-untyped-def]
        return []


async def _collect(stream: RequestStream, prompt_ids: list[int]) -> tuple[RequestOutput, str | None]:
    """One request's outputs into its RequestOutput, and its error if it failed."""
    result, error = RequestOutput(prompt_ids, ""), None
    for out in await stream.whole():
        result.text += out.text_delta
        if out.token_id is not None:
            result.token_ids.append(out.token_id)
        error = out.error or error
        if out.finished:
            result.finish_reason, result.cached_tokens = out.finish_reason, out.cached_tokens
            result.embedding = out.embedding
    return result, error


def _stop_all(cores: list[CoreProcess]) -> None:
    for core in cores:
        core.stop()
