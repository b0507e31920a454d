"""The runner of one rank: its shard of the model loaded, its KV cache sized, its graphs captured.

`build_engine` builds rank 0's (or the only) runner here and a tensor-parallel worker its own, from the same code, so
every rank agrees on the block count and captures the same graphs in the same order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from infer.distributed.group import Groups
from infer.distributed.tp_runner import TensorParallelRunner
from infer.engine.config import EngineConfig, EngineConfigError
from infer.kv.sizing import kv_bytes_per_token, kv_layout
from infer.loader.model_loader import LoadedModel, load_model
from infer.loader.model_path import resolve_model_path
from infer.lora.stacks import LoRAWeights
from infer.families.config import ModelConfig
from infer.models.shard import Shard
from infer.runners.cuda_graphs import bucket_sizes
from infer.runners.drafter import Drafter
from infer.runners.prefill_graphs import prefill_bucket_sizes
from infer.runners.torch_runner import TorchRunner
from omniscience import ProbeBank

if TYPE_CHECKING:
    from infer.distributed.workers import WorkerSet


CPU_KV_CACHE_BYTES = 2**30  # the CPU's default KV cache at most (a draft model shares it)


def kv_cache_bytes(config: EngineConfig, model: ModelConfig) -> float:
    """The KV cache's budget: kv_cache_memory_gb when given; on CUDA otherwise what gpu_memory_utilization leaves
    of the device once the weights are loaded, less a reserve for the largest step's activations and logits; on
    the CPU 1 GiB, or less when max_batch_size full-length sequences need less (the cache is resident memory)."""
    if config.kv_cache_memory_gb is not None:
        return config.kv_cache_memory_gb * 2**30
    if not config.resolved_device.startswith("cuda"):
        need = kv_bytes_per_token(model, config.kv_cache_dtype) * config.max_seq_len * config.max_batch_size
        return float(CPU_KV_CACHE_BYTES if config.draft_model is not None else min(CPU_KV_CACHE_BYTES, need))
    free, total = torch.cuda.mem_get_info(torch.device(config.resolved_device))
    return device_kv_budget(config, model, total, total - free, "the device")


def device_kv_budget(config: EngineConfig, model: ModelConfig, total: float, in_use: float, pool: str) -> float:
    """What gpu_memory_utilization leaves of `total` bytes of device memory (`pool` names it in the error) for the KV
    cache once `in_use` bytes (the weights) and a reserve for the largest step's activations and logits are counted;
    EngineConfigError when that is less than one max_seq_len sequence (CUDA's rule, and Metal's for the MLX runner)."""
    itemsize = torch.empty((), dtype=config.torch_dtype).element_size()
    tokens = max(config.max_num_batched_tokens or 0, config.decode_rows)
    activations = 16 * tokens * model.hidden_size * itemsize + 3 * config.decode_rows * model.vocab_size * 4
    budget = total * config.gpu_memory_utilization - in_use - activations
    if budget < kv_bytes_per_token(model, config.kv_cache_dtype) * config.max_seq_len:
        raise EngineConfigError(
            f"gpu_memory_utilization={config.gpu_memory_utilization}: leaves {budget / 2**30:.2f} GiB for the KV cache "
            f"after the weights ({in_use / 2**30:.1f} GiB in use of {pool}'s {total / 2**30:.1f}), less than one "
            f"max_seq_len={config.max_seq_len} sequence; raise it, lower max_seq_len or set kv_cache_memory_gb")
    return budget


def load_rank_model(config: EngineConfig, shard: Shard = Shard()) -> LoadedModel:
    """The configured model (this tensor-parallel rank's shard of it, its experts with enable_expert_parallel) on the
    configured device."""
    shard = shard._replace(expert_parallel=config.enable_expert_parallel and shard.parallel)
    return load_model(resolve_model_path(config.model), config.torch_dtype, config.resolved_device, config.max_seq_len,
                      config.load_format, config.quantization, shard, config.matmul_dtype)


def bounded(config: EngineConfig, model: ModelConfig) -> EngineConfig:
    """max_seq_len bounded by the model's positions (every rank builds from the same bounded config)."""
    return replace(config, max_seq_len=min(config.max_seq_len, model.max_position_embeddings))


def build_rank_runner(config: EngineConfig, loaded: LoadedModel, groups: Groups | None, probes: ProbeBank | None,
                      drafter: LoadedModel | None = None, workers: WorkerSet | None = None) -> TorchRunner:
    """The runner of one rank (or of the only one): its KV cache sized by its own KV heads, the block count agreed
    as the minimum over the ranks, prefill and decode graphs captured (every rank captures the same buckets in the
    same order)."""
    config = bounded(config, loaded.config)
    local = loaded.model.local
    # the adapters' device slots before the KV cache takes what memory is left
    lora = LoRAWeights(loaded.model, config.max_loras, config.max_lora_rank, config.cpu_loras,
                       config.max_batch_size) if config.enable_lora else None
    layout = kv_layout(
        local, config.kv_cache_dtype, config.kv_cache_backend, config.block_size, config.max_seq_len,
        config.max_batch_size, config.num_kv_blocks, kv_cache_bytes(config, local),
        draft=drafter.config if drafter is not None else None,
    )
    num_blocks = layout.num_blocks if groups is None else groups.agree_min(layout.num_blocks)
    args = (loaded.model, num_blocks, layout.block_size, config.max_batch_size, config.max_seq_len,
            bucket_sizes(config.decode_rows) if config.decode_graphs else (), probes)
    kwargs: dict[str, Any] = dict(
        prefill_graph_tokens=prefill_bucket_sizes(config.max_num_batched_tokens or 0) if config.prefill_graphs else (),
        max_drafts=config.speculative_tokens, lora=lora, kv_cache_dtype=config.kv_cache_dtype,
        drafter=None if drafter is None else Drafter(
        drafter.model, num_blocks, layout.block_size, config.max_batch_size, config.max_seq_len,
        bucket_sizes(2 * config.max_batch_size) if config.decode_graphs else ()))
    if groups is not None and groups.shard.rank == 0:
        return TensorParallelRunner(groups, workers, *args, **kwargs)
    return TorchRunner(*args, **kwargs)
