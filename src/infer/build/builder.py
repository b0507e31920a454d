"""`build_engine(config)`: the one place an engine is assembled (weights, tokenizer, KV cache, runner).

`LLM`, the CLI and the server all start here; what they share beyond the engine (the tokenizer, the
model's config, its chat template) travels in the returned `BuiltEngine`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from infer.distributed.group import DistributedError
from infer.distributed.startup import distributed_config, start_rank0
from infer.lora.adapter import LoRAError
from infer.lora.registry import LoRARegistry
from infer.engine.config import EngineConfig, EngineConfigError
from infer.engine.core import EngineCore
from infer.build.in_process import Engine
from infer.build.rank_runner import bounded, build_rank_runner, load_rank_model
from infer.build.startup_log import Clock, phase, runner_phases
from infer.build.warmup import warm_up
from infer.kv.kv_manager import KVCacheManager
from infer.loader.model_loader import LoadedModel, load_model, read_config
from infer.loader.model_path import resolve_model_path
from infer.loader.tokenizer import Tokenizer
from infer.loader.tokenizer_prefetch import TokenizerPrefetch
from infer.families.config import ModelConfig
from infer.frontend.served import ServedModel
from infer.heap import settle_heap
from infer.models.shard import Shard, ShardError
from infer.speculative.gate import gate_speculation
from omniscience import ProbeBank, ProbeError, ProbeSet, load_probe_set


@dataclass(frozen=True)
class BuiltEngine(ServedModel):
    """An engine and what its callers need beside it."""

    engine: EngineCore  # an Engine (text included) unless built with core_only
    load_seconds: float  # weights loaded, cache allocated, graphs captured, warmed up
    warmup_seconds: float = 0.0  # of which the warm-up's (build/warmup.py)

    def read_probe_set(self) -> ProbeSet:
        """Re-read the configured probe-set file against this model (a reload; ProbeError when it is invalid)."""
        if self.config.probes is None:
            raise ValueError("probes: no probe set is loaded, so there is nothing to reload")
        return read_probe_set(self.config.probes, self.model_config)


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
                             config.max_seq_len, config.load_format, config.quantization,
                             matmul_dtype=config.matmul_dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise EngineConfigError(f"draft_model={config.draft_model!r}: cannot load it: {exc}") from exc
    if drafter.config.vocab_size != target.vocab_size:
        raise EngineConfigError(
            f"draft_model={config.draft_model!r}: its vocabulary has {drafter.config.vocab_size} tokens and the "
            f"target's has {target.vocab_size}; a drafter must share the target's tokenizer and vocabulary"
        )
    return drafter


def build_engine(config: EngineConfig, core_only: bool = False, hard_exit: bool = False,
                 tokenizer_prefetch: TokenizerPrefetch | None = None) -> BuiltEngine:
    """Load the model and tokenizer, size the KV cache, build the runner (capturing CUDA graphs) and the engine:
    an Engine that detokenizes (offline use), or with `core_only` the bare EngineCore a core process runs.
    On CUDA, and for a core process on any device, the engine is warmed up before it is returned.
    With tensor_parallel_size > 1 this process is rank 0: it starts its node's workers first (docs/distributed.md);
    `hard_exit` (a core process) ends the process when a worker dies and the engine loop is stuck in a collective.
    `tokenizer_prefetch`: the model's tokenizer being read meanwhile (a core process starts it before importing the
    engine), else it is read here."""
    started = time.perf_counter()
    path = resolve_model_path(config.model)
    config = distributed_config(config)
    if config.resolved_runner == "mlx":  # the MLX engine (docs/apple.md)
        from infer.build.mlx_builder import build_mlx_engine

        mlx = build_mlx_engine(config, path, core_only)
        settle_heap()
        return BuiltEngine(mlx.config, mlx.model_config, mlx.tokenizer, path, mlx.engine, time.perf_counter() - started,
                           mlx.warmup_seconds)
    groups, workers = None, None
    if config.resolved_device.startswith("cuda:"):  # graphs capture on the current device's stream: make it ours
        torch.cuda.set_device(torch.device(config.resolved_device))
    if config.tensor_parallel_size > 1:
        try:
            shard = Shard(0, config.tensor_parallel_size, expert_parallel=config.enable_expert_parallel)
            shard.check(read_config(path))  # before any worker starts
        except ShardError as exc:
            raise EngineConfigError(str(exc)) from None
        groups, workers, config = start_rank0(config, hard_exit)
    clock = Clock()
    try:
        loaded = load_rank_model(config, groups.shard if groups is not None else Shard())
        config = bounded(config, loaded.config)
        phase("weights loaded", clock.lap(), f"{path.name}, {config.resolved_device}")
        tokenizer = tokenizer_prefetch.result() if tokenizer_prefetch is not None else Tokenizer.from_path(path)
        drafter = load_drafter(config, loaded.config) if config.draft_model is not None else None
        phase("tokenizer" + (" and draft model" if drafter is not None else "") + " loaded", clock.lap(),
              "read meanwhile by a child process" if tokenizer_prefetch and tokenizer_prefetch.from_child else "")
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
    loras = LoRARegistry(loaded.config, config.max_lora_rank) if config.enable_lora else None
    engine = (EngineCore if core_only else Engine)(config, runner, kv, tokenizer, loras)
    for name, adapter in (config.lora_modules or {}).items():
        try:
            engine.add_lora(name, adapter)
        except LoRAError as exc:
            raise EngineConfigError(f"lora_modules: {exc}") from None
    gate_speculation(engine.scheduler, config.speculative_disable_by_batch_size)
    warmup_seconds = warm_up(engine) if core_only or runner.device.type == "cuda" else 0.0
    if warmup_seconds:
        phase("warm-up", warmup_seconds)
    settle_heap()
    return BuiltEngine(config, loaded.config, tokenizer, path, engine, time.perf_counter() - started, warmup_seconds)
