"""EngineConfig: every runtime knob in one validated place; a bad value fails at startup naming the field."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_BACKENDS = ("paged", "contiguous")


class EngineConfigError(ValueError):
    """An invalid EngineConfig field; the message starts with the field name."""


@dataclass
class EngineConfig:
    model: str | None = None  # HF directory, .gguf file, or None for the bundled SmolLM2
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # "auto" = cuda if available else cpu
    max_seq_len: int = 4096
    seed: int = 0
    max_batch_size: int = 32
    max_num_batched_tokens: int | None = None  # None = max(8192, max_seq_len)
    kv_cache_backend: str = "paged"
    block_size: int = 16
    num_kv_blocks: int | None = None  # None = as many as kv_cache_memory_gb holds (slots, in contiguous mode)
    kv_cache_memory_gb: float = 1.0

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(8192, self.max_seq_len)
        self._check("dtype", self.dtype in ("auto", *DTYPES), f"must be auto or one of {', '.join(DTYPES)}")
        self._check("device", self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"), "must be auto, cpu or cuda[:N]")
        self._check("kv_cache_backend", self.kv_cache_backend in KV_BACKENDS, f"must be one of {', '.join(KV_BACKENDS)}")
        for name in ("max_seq_len", "max_batch_size", "max_num_batched_tokens", "block_size"):
            self._check(name, getattr(self, name) >= 1, "must be >= 1")
        self._check("num_kv_blocks", self.num_kv_blocks is None or self.num_kv_blocks >= 1, "must be >= 1 or None")
        self._check("kv_cache_memory_gb", self.kv_cache_memory_gb > 0, "must be > 0")
        self._check(
            "max_num_batched_tokens", self.max_num_batched_tokens >= self.max_seq_len,
            f"must be >= max_seq_len ({self.max_seq_len}) so that any admitted prompt fits one prefill step",
        )

    def _check(self, field: str, ok: bool, message: str) -> None:
        if not ok:
            raise EngineConfigError(f"{field}={getattr(self, field)!r}: {message}")

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        return torch.bfloat16 if self.resolved_device.startswith("cuda") else torch.float32

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
