"""`build_engine(config)`: the one place an engine is assembled (weights, tokenizer, KV cache, runner).

`LLM`, the CLI and the server all start here; what they share beyond the engine (the tokenizer, the
model's config, its chat template) travels in the returned `BuiltEngine`.
"""

from __future__ import annotations

import functools
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infer.distributed.group import DistributedError
from infer.distributed.startup import distributed_config, start_rank0
from infer.engine.config import EngineConfig, EngineConfigError
from infer.engine.core import EngineCore
from infer.engine.engine import Engine
from infer.engine.rank_runner import bounded, build_rank_runner, load_rank_model, resolve_model_path
from infer.engine.startup_log import Clock, phase, runner_phases
from infer.engine.warmup import warm_up
from infer.kv.kv_manager import KVCacheManager
from infer.loader.model_loader import LoadedModel, load_model, read_config
from infer.loader.tokenizer import Tokenizer
from infer.loader.generation_config import sampling_defaults
from infer.models.chat_template import (
    ChatTemplateError, TEMPLATE_DIR, load_template, load_template_file, render_template, template_source,
)
from infer.models.config import ModelConfig
from infer.models.registry import model_spec
from infer.models.shard import Shard, ShardError
from infer.speculative.gate import gate_speculation
from omniscience import ProbeBank, ProbeError, ProbeSet, load_probe_set

Messages = list[dict[str, Any]]
CUSTOM_TEMPLATE = "custom"  # chat_template_name of a template file on a family with no bundled template


def chat_template_name(model_type: str, tokenizer: Tokenizer) -> str:
    """The bundled chat template for a model family whose tokenizer has the template's marker token."""
    for name, marker in model_spec(model_type).chat_templates:
        if tokenizer.has_token(marker):
            return name
    raise ChatTemplateError(
        f"no chat template for this {model_type} tokenizer; "
        f"add one to {TEMPLATE_DIR} and register it in infer/models/registry.py"
    )


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

    def read_probe_set(self) -> ProbeSet:
        """Re-read the configured probe-set file against this model (a reload; ProbeError when it is invalid)."""
        if self.config.probes is None:
            raise ValueError("probes: no probe set is loaded, so there is nothing to reload")
        return read_probe_set(self.config.probes, self.model_config)


@dataclass(frozen=True)
class BuiltEngine(ServedModel):
    """An engine and what its callers need beside it."""

    engine: EngineCore  # an Engine (text included) unless built with core_only
    load_seconds: float  # weights loaded, cache allocated, graphs captured, warmed up
    warmup_seconds: float = 0.0  # of which the warm-up's (engine/warmup.py)


def read_probe_set(path: str, model_config: ModelConfig) -> ProbeSet:
    """A probe-set file validated against the model's hidden size and layer count."""
    return load_probe_set(path, model_config.hidden_size, model_config.num_hidden_layers)


def probe_bank(config: EngineConfig, model_config: ModelConfig) -> ProbeBank | None:
    """The configured probe set, validated against the model, in device buffers for the largest step."""
    if config.probes is None:
        return None
    try:
        probe_set = read_probe_set(config.probes, model_config)
    except ProbeError as exc:
        raise EngineConfigError(f"probes={config.probes!r}: {exc}") from exc
    rows = max(config.max_num_batched_tokens or 0, config.decode_rows)  # the most rows one forward has
    return ProbeBank(probe_set, model_config.hidden_size, rows, torch.device(config.resolved_device))


def load_drafter(config: EngineConfig, target: ModelConfig) -> LoadedModel:
    """The draft model, on the target's device and dtype; its vocabulary must be the target's (drafts are token ids)."""
    assert config.draft_model is not None
    try:
        drafter = load_model(Path(config.draft_model).expanduser(), config.torch_dtype, config.resolved_device,
                             config.max_seq_len, config.load_format, config.quantization)
    except (OSError, ValueError, KeyError) as exc:
        raise EngineConfigError(f"draft_model={config.draft_model!r}: cannot load it: {exc}") from exc
    if drafter.config.vocab_size != target.vocab_size:
        raise EngineConfigError(
            f"draft_model={config.draft_model!r}: its vocabulary has {drafter.config.vocab_size} tokens and the "
            f"target's has {target.vocab_size}; a drafter must share the target's tokenizer and vocabulary"
        )
    return drafter


# Python's collector thresholds once an engine runs (default 700, 10, 10): a full collection walks every object
# serving keeps (the prefix cache's nodes, live requests) and paused a batch-256 step ~0.3 s about every 1,500 steps
# on an H200 (benchmarks/run_variance.py). With these, young collections of up to 20,000 objects stay ~1 ms and
# still free young cycles, and a full collection waits for ~200M allocations: none in 1,600 such steps measured.
# Reference counting frees everything but cycles as before.
GC_THRESHOLDS = (20_000, 10, 1000)


def settle_heap() -> None:
    """Once per process, after start-up (an engine built, an API server ready): what is alive now lives as long as
    the process, so it is frozen out of the garbage collector (a full collection then walks only what serving made:
    ~0.3 s -> ~0.02 s on the CPU) and the collector gets GC_THRESHOLDS. A library may have frozen objects before, so
    the thresholds, not the freeze count, tell whether this ran (docs/engine.md, host cost)."""
    if gc.get_threshold() != GC_THRESHOLDS:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)


def build_engine(config: EngineConfig, core_only: bool = False, hard_exit: bool = False) -> BuiltEngine:
    """Load the model and tokenizer, size the KV cache, build the runner (capturing CUDA graphs) and the engine:
    an Engine that detokenizes (offline use), or with `core_only` the bare EngineCore a core process runs.
    On CUDA, and for a core process on any device, the engine is warmed up before it is returned.
    With tensor_parallel_size > 1 this process is rank 0: it starts its node's workers first (docs/distributed.md);
    `hard_exit` (a core process) ends the process when a worker dies and the engine loop is stuck in a collective."""
    started = time.perf_counter()
    path = resolve_model_path(config.model)
    config = distributed_config(config)
    if config.resolved_runner == "mlx":  # the MLX engine (docs/apple.md)
        from infer.engine.mlx_builder import build_mlx_engine

        mlx = build_mlx_engine(config, path, core_only)
        settle_heap()
        return BuiltEngine(mlx.config, mlx.model_config, mlx.tokenizer, path, mlx.engine, time.perf_counter() - started,
                           mlx.warmup_seconds)
    groups, workers = None, None
    if config.resolved_device.startswith("cuda:"):  # graphs capture on the current device's stream: make it ours
        torch.cuda.set_device(torch.device(config.resolved_device))
    if config.tensor_parallel_size > 1:
        try:
            Shard(0, config.tensor_parallel_size).check(read_config(path))  # before any worker starts
        except ShardError as exc:
            raise EngineConfigError(str(exc)) from None
        groups, workers, config = start_rank0(config, hard_exit)
    clock = Clock()
    try:
        loaded = load_rank_model(config, groups.shard if groups is not None else Shard())
        config = bounded(config, loaded.config)
        phase("weights loaded", clock.lap(), f"{path.name}, {config.resolved_device}")
        tokenizer = Tokenizer.from_path(path)
        drafter = load_drafter(config, loaded.config) if config.draft_model is not None else None
        phase("tokenizer" + (" and draft model" if drafter is not None else "") + " loaded", clock.lap())
        runner = build_rank_runner(config, loaded, groups, probe_bank(config, loaded.config), drafter, workers)
        runner_phases(runner, clock.lap())
    except BaseException as exc:
        if groups is not None:  # the workers may wait in a collective for this rank: end them
            failure = workers.failure if workers is not None else None
            if workers is not None:
                workers.join(0)
            groups.close()
            if isinstance(exc, ShardError):  # a checkpoint tensor that cannot be cut (on this rank, or on every one)
                raise EngineConfigError(str(exc)) from None
            if failure is not None:
                raise DistributedError(failure) from exc
        raise
    kv = KVCacheManager(runner.num_blocks, runner.block_size, prefix_caching=bool(config.use_prefix_caching))
    engine = (EngineCore if core_only else Engine)(config, runner, kv, tokenizer)
    gate_speculation(engine.scheduler, config.speculative_disable_by_batch_size)
    warmup_seconds = warm_up(engine) if core_only or runner.device.type == "cuda" else 0.0
    if warmup_seconds:
        phase("warm-up", warmup_seconds)
    settle_heap()
    return BuiltEngine(config, loaded.config, tokenizer, path, engine, time.perf_counter() - started, warmup_seconds)
