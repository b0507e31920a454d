"""Assembling an engine around the MLX runner (EngineConfig.runner="mlx"): what build_engine does for torch, with
the checkpoint read by the same loaders and handed to MLX, and every feature the MLX runner does not run declined
here, at startup, naming the field (docs/apple.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from infer.engine.config import EngineConfig, EngineConfigError
from infer.runners.mlx import apple_metal, mlx_available

if TYPE_CHECKING:
    from infer.engine.core import EngineCore
    from infer.loader.tokenizer import Tokenizer
    from infer.families.config import ModelConfig

# (field, whether the config asks for it, why the MLX runner declines it)
DECLINED = (
    ("probes", lambda c: c.probes is not None,
     "omniscience probes are torch-only (their banks and taps live in torch buffers); use runner='torch'"),
    ("speculative_method", lambda c: c.speculative_method is not None,
     "speculative decoding is not built on the mlx runner (no draft verification); use runner='torch'"),
    ("quantization", lambda c: c.quantization in ("int4", "int8", "fp8"),
     "quantizing at load is torch-only; the mlx runner keeps a GGUF's 4-bit and Q8_0 weights as stored ('auto') "
     "or dequantizes ('none')"),
    ("device", lambda c: c.device.startswith("cuda"), "the mlx runner runs on Apple silicon (Metal) or the CPU"),
)


def check_mlx_config(config: EngineConfig) -> None:
    """EngineConfigError for a configuration the MLX runner does not run (never silently run another way)."""
    if not mlx_available():
        raise EngineConfigError("runner='mlx': the mlx package is not installed (pip install -e '.[mlx]')")
    for name, asked, why in DECLINED:
        if asked(config):
            raise EngineConfigError(f"{name}={getattr(config, name)!r}: {why}")
    if getattr(config, "tensor_parallel_size", 1) != 1:
        raise EngineConfigError(f"tensor_parallel_size={config.tensor_parallel_size!r}: the mlx runner runs on one "
                                f"device")


def mlx_dtype_name(config: EngineConfig) -> str:
    """"auto": float16 on Metal (a GGUF's fp16 scales stay exact), float32 on MLX's CPU backend."""
    if config.dtype != "auto":
        return config.dtype
    return "float16" if apple_metal() else "float32"


def mlx_kv_cache_bytes(config: EngineConfig, model: ModelConfig, device_info: dict, in_use: int) -> float:
    """The KV cache's budget in unified memory: kv_cache_memory_gb when given; otherwise CUDA's rule
    (`device_kv_budget`) over Metal's recommended working set (`device_info`, `mx.device_info()`) with the weights
    (`in_use` bytes, `mx.get_active_memory()`) counted, at most what max_batch_size full-length sequences need, since
    the memory is the whole machine's. `config.dtype` is the resolved one."""
    import torch

    from infer.build.rank_runner import device_kv_budget
    from infer.kv.sizing import kv_bytes_per_token

    if config.kv_cache_memory_gb is not None:
        return config.kv_cache_memory_gb * 2**30
    working_set = float(device_info.get("max_recommended_working_set_size") or device_info["memory_size"])
    budget = device_kv_budget(config, model, working_set, in_use, "the Metal working set")
    need = kv_bytes_per_token(model, getattr(torch, config.dtype)) * config.max_seq_len * config.max_batch_size
    return min(budget, float(need))


class MlxEngine(NamedTuple):
    """An engine around the MLX runner and what build_engine returns beside it."""

    config: EngineConfig  # max_seq_len bounded by the model's positions
    model_config: ModelConfig
    tokenizer: Tokenizer
    engine: EngineCore
    warmup_seconds: float


def build_mlx_engine(config: EngineConfig, path: Path, core_only: bool) -> MlxEngine:
    """Load the checkpoint into MLX, size the KV cache, build the MlxRunner and the engine around it."""
    import mlx.core as mx
    import torch

    from infer.engine.core import EngineCore
    from infer.build.in_process import Engine
    from infer.build.rank_runner import kv_cache_bytes
    from infer.build.warmup import warm_up
    from infer.kv.kv_manager import KVCacheManager
    from infer.kv.sizing import kv_layout
    from infer.loader.tokenizer import Tokenizer
    from infer.runners.mlx.model import MlxModel
    from infer.runners.mlx.runner import MlxRunner
    from infer.runners.mlx.weights import MX_DTYPES, load_torch_model

    check_mlx_config(config)
    dtype = mlx_dtype_name(config)
    staged = load_torch_model(path, config.load_format, config.quantization, config.max_seq_len)
    model = MlxModel(staged, MX_DTYPES[dtype], config.quantization)
    mx.eval(model.parameters())  # every weight made now; the torch staging copy is dropped below
    model_config = staged.config
    del staged
    tokenizer = Tokenizer.from_path(path)
    config = replace(config, max_seq_len=min(config.max_seq_len, model_config.max_position_embeddings))
    sized = replace(config, dtype=dtype)
    budget = mlx_kv_cache_bytes(sized, model_config, mx.device_info(), mx.get_active_memory()) if apple_metal() \
        else kv_cache_bytes(sized, model_config)  # MLX's CPU backend: the CPU's rule (resident memory)
    layout = kv_layout(model_config, getattr(torch, dtype), config.kv_cache_backend, config.block_size,
                       config.max_seq_len, config.max_batch_size, config.num_kv_blocks, budget)
    runner = MlxRunner(model, layout.num_blocks, layout.block_size, config.max_batch_size)
    kv = KVCacheManager(layout.num_blocks, layout.block_size, prefix_caching=bool(config.use_prefix_caching))
    engine = (EngineCore if core_only else Engine)(config, runner, kv, tokenizer)  # type: ignore[arg-type]
    return MlxEngine(config, model_config, tokenizer, engine, warm_up(engine) if core_only else 0.0)
