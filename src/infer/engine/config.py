"""EngineConfig: every runtime knob in one validated place; a bad value fails at startup naming the field."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from infer.engine.devices import cuda_device_count
from infer.engine.policy import POLICIES
from infer.sampling.params import POOLINGS
from infer.families.chat_template import ChatTemplateError, load_template_file

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")  # names of torch dtypes: this module imports no torch (the API server reads it)
KV_BACKENDS = ("paged", "contiguous")
BATCHING_MODES = ("continuous", "static")
SCHEDULER_POLICIES = tuple(POLICIES)
QUANTIZATIONS = ("auto", "none", "int4", "int8", "fp8")
LOAD_FORMATS = ("auto", "dummy")
SPECULATIVE_METHODS = (None, "ngram", "draft")
RUNNERS = ("auto", "torch", "mlx")  # execution engines: docs/apple.md for mlx
LOAD_BALANCE_METHODS = ("round_robin", "least_load", "prefix_affinity")
DEFAULT_SPECULATIVE_TOKENS = 4


class EngineConfigError(ValueError):
    """An invalid EngineConfig field; the message starts with the field name."""


@dataclass
class EngineConfig:
    model: str | None = None  # HF directory, .gguf file, or None for the bundled SmolLM2
    load_format: str = "auto"  # "auto" reads the checkpoint; "dummy" = random weights (benchmarks, as vLLM's)
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # "auto" = cuda if available else cpu
    max_seq_len: int = 4096
    seed: int = 0
    max_batch_size: int | None = None  # None = 256 on CUDA, 32 on the CPU
    max_num_batched_tokens: int | None = None  # None = max(8192, max_seq_len)
    kv_cache_backend: str = "paged"
    block_size: int = 16
    num_kv_blocks: int | None = None  # None = as many as kv_cache_memory_gb holds (slots, in contiguous mode)
    kv_cache_memory_gb: float | None = None  # None = 1 GB on the CPU; on CUDA sized by gpu_memory_utilization
    gpu_memory_utilization: float = 0.9  # CUDA: the share of the device's memory weights, activations and KV may use
    batching_mode: str = "continuous"  # static: admit a new batch only once the running one has finished
    scheduler_policy: str = "fcfs"  # which kind of step runs next: see infer/engine/policy.py
    fairness_steps: int = 4  # every decoding sequence gets a token at least once every N steps
    pooling: str = "last"  # embeddings: the final hidden states' pooling, "last" (decoder embedders), "mean" or "cls"
    max_waiting_requests: int = 256  # the server answers 503 beyond this many queued requests
    use_chunked_prefill: bool | None = None  # None = on for continuous batching: prompts split over steps
    prefill_chunk_size: int = 512  # most prompt tokens of one request in one step
    max_prefill_chunks_per_step: int | None = None  # None = as many as the token budget and batch size allow
    use_prefix_caching: bool | None = None  # None = on with chunked prefill and the paged cache (docs/engine.md)
    # None = on with the paged cache: decode (on the CPU: recorded calls), and on CUDA prefill and mixed steps too
    use_cuda_graphs: bool | None = None
    quantization: str = "auto"  # "auto": weights stay as stored (8-bit HF, 4-bit / Q8_0 GGUF); "none"; "int4" | "int8" | "fp8" at load: docs/quantization.md
    probes: str | None = None  # a probe-set YAML file (omniscience): probe scores per token, docs/omniscience.md
    speculative_method: str | None = None  # "ngram" (prompt lookup) or "draft" (a smaller model): docs/speculative.md
    num_speculative_tokens: int | None = None  # drafts per step and request (k); None = 4 with a method
    prompt_lookup_min: int = 1  # ngram: the shortest suffix looked up
    prompt_lookup_max: int = 4  # ngram: the longest suffix looked up (tried first)
    draft_model: str | None = None  # draft: the drafter's checkpoint (same tokenizer and vocabulary)
    speculative_disable_by_batch_size: int | None = None  # ngram: no drafts while this many run; None = 2 on the CPU, 0 (never) on CUDA
    structured_compile_timeout_s: float = 10.0  # a grammar not compiled within this is refused (400), never waited on
    runner: str = "auto"  # "torch", "mlx" (Apple silicon; MLX's CPU backend elsewhere), "auto": mlx on Apple silicon with Metal
    chat_template: str | None = None  # a Jinja2 file rendered instead of the family's bundled chat template
    # the server's sampling defaults: "auto" = the model directory's generation_config.json, "vllm" = none, or a
    # folder holding a generation_config.json (vLLM's --generation-config)
    generation_config: str = "auto"
    # LoRA adapters (docs/lora.md): up to max_loras in device slots, max_cpu_loras (None = max_loras) read ones kept on
    # the host; lora_modules: adapters registered at start, {name: PEFT adapter directory}
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_modules: dict[str, str] | None = None
    # scale-out (docs/distributed.md): TP ranks on consecutive devices from `device`; DP engine cores behind one API server
    tensor_parallel_size: int = 1  # ranks one model is sharded over (NCCL on CUDA, gloo on the CPU)
    # a mixture of experts' whole experts on the tensor-parallel ranks (E / ranks each) instead of every expert's
    # slice of its intermediate dimension on every rank
    enable_expert_parallel: bool = False
    data_parallel_size: int = 1  # engine cores, each with its own TP group
    load_balance_method: str = "least_load"  # how the API server picks a DP engine for a request
    nnodes: int = 1  # hosts the TP group spans (the ranks split evenly over them)
    node_rank: int = 0  # this host's place among them; 0 serves, the others run headless workers
    master_addr: str = "127.0.0.1"  # rank 0's host, for the rendezvous
    master_port: int = 29500  # rank 0's rendezvous port
    distributed_timeout_s: float = 60.0  # a collective or a worker silent this long fails the engine (never a hang)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(8192, self.max_seq_len)
        if self.use_chunked_prefill is None:
            self.use_chunked_prefill = self.batching_mode == "continuous"
        if self.use_prefix_caching is None:
            self.use_prefix_caching = bool(self.use_chunked_prefill) and self.kv_cache_backend == "paged"
        if self.max_batch_size is None:
            self.max_batch_size = 256 if self.resolved_device.startswith("cuda") else 32
        if self.speculative_disable_by_batch_size is None:  # measured: docs/speculative.md
            self.speculative_disable_by_batch_size = 0 if self.resolved_device.startswith("cuda") else 2
        self._check("load_format", self.load_format in LOAD_FORMATS, f"must be one of {', '.join(LOAD_FORMATS)}")
        self._check("dtype", self.dtype in ("auto", *DTYPES), f"must be auto or one of {', '.join(DTYPES)}")
        self._check("device", self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"), "must be auto, cpu or cuda[:N]")
        self._check("kv_cache_backend", self.kv_cache_backend in KV_BACKENDS, f"must be one of {', '.join(KV_BACKENDS)}")
        for name in ("max_seq_len", "max_batch_size", "max_num_batched_tokens", "block_size"):
            self._check(name, getattr(self, name) >= 1, "must be >= 1")
        self._check("num_kv_blocks", self.num_kv_blocks is None or self.num_kv_blocks >= 1, "must be >= 1 or None")
        self._check("kv_cache_memory_gb", self.kv_cache_memory_gb is None or self.kv_cache_memory_gb > 0, "must be > 0")
        self._check("gpu_memory_utilization", 0 < self.gpu_memory_utilization <= 1, "must be in (0, 1]")
        self._check("pooling", self.pooling in POOLINGS, f"must be one of {', '.join(POOLINGS)}")
        self._check("batching_mode", self.batching_mode in BATCHING_MODES, f"must be one of {', '.join(BATCHING_MODES)}")
        self._check(
            "scheduler_policy", self.scheduler_policy in SCHEDULER_POLICIES, f"must be one of {', '.join(SCHEDULER_POLICIES)}"
        )
        self._check("fairness_steps", self.fairness_steps >= 2, "must be >= 2 (1 would never let a prefill run while anything decodes)")
        for name in ("max_waiting_requests", "prefill_chunk_size"):
            self._check(name, getattr(self, name) >= 1, "must be >= 1")
        self._check("max_prefill_chunks_per_step",
                    self.max_prefill_chunks_per_step is None or self.max_prefill_chunks_per_step >= 1, "must be >= 1 or None")
        self._check("structured_compile_timeout_s", self.structured_compile_timeout_s > 0, "must be > 0")
        self._check("quantization", self.quantization in QUANTIZATIONS, f"must be one of {', '.join(QUANTIZATIONS)}")
        self._check("runner", self.runner in RUNNERS, f"must be one of {', '.join(RUNNERS)}")
        self._check("probes", self.probes is None or (isinstance(self.probes, str) and Path(self.probes).expanduser().is_file()),
                    "must be the path of an existing probe-set YAML file")
        self._templates()
        self._compatibility()
        self._distributed()
        self._lora()
        self._check(
            "max_num_batched_tokens", self.max_num_batched_tokens >= self.max_seq_len,
            f"must be >= max_seq_len ({self.max_seq_len}) so that any admitted prompt fits one prefill step",
        )

    def _templates(self) -> None:
        """The chat template file compiles and the generation config names a folder, before anything loads."""
        if self.chat_template is not None:
            self._check("chat_template", Path(self.chat_template).expanduser().is_file(),
                        "must be the path of an existing Jinja2 file")
            try:
                load_template_file(self.chat_template)
            except ChatTemplateError as exc:
                self._check("chat_template", False, str(exc))
        self._check("generation_config", self.generation_config in ("auto", "vllm")
                    or Path(self.generation_config).expanduser().is_dir(),
                    "must be 'auto' (the model's generation_config.json), 'vllm' (none) or a folder holding one")

    def _compatibility(self) -> None:
        """The seed's feature-flag rules, then a clear refusal for features not built yet."""
        continuous = self.batching_mode == "continuous"
        paged = self.kv_cache_backend == "paged"
        self._check("use_chunked_prefill", not self.use_chunked_prefill or continuous, "requires batching_mode='continuous'")
        self._check(
            "use_prefix_caching", not self.use_prefix_caching or (paged and self.use_chunked_prefill),
            "requires kv_cache_backend='paged' and use_chunked_prefill=True",
        )
        self._check(
            "use_cuda_graphs", not self.use_cuda_graphs or (continuous and paged),
            "requires batching_mode='continuous' and kv_cache_backend='paged'",
        )
        self._check("use_cuda_graphs", not self.use_cuda_graphs or self.resolved_device.startswith("cuda"),
                    "requires a CUDA device")
        self._speculative()

    def _speculative(self) -> None:
        method = self.speculative_method
        self._check("speculative_method", method in SPECULATIVE_METHODS, "must be None, 'ngram' or 'draft'")
        k = self.num_speculative_tokens
        self._check("num_speculative_tokens", k is None or method is not None, "requires speculative_method")
        self._check("num_speculative_tokens", k is None or (isinstance(k, int) and k >= 1), "must be >= 1")
        self._check("prompt_lookup_min", self.prompt_lookup_min >= 1, "must be >= 1")
        self._check("prompt_lookup_max", self.prompt_lookup_max >= self.prompt_lookup_min,
                    f"must be >= prompt_lookup_min ({self.prompt_lookup_min})")
        self._check("draft_model", self.draft_model is None or method == "draft", "requires speculative_method='draft'")
        self._check("speculative_disable_by_batch_size", self.speculative_disable_by_batch_size >= 0, "must be >= 0")
        self._check("speculative_method", method != "draft" or self.draft_model is not None, "'draft' requires draft_model")
        self._check("draft_model", self.draft_model is None or Path(self.draft_model).expanduser().exists(),
                    "does not exist")
        self._check("speculative_method", method is None or self.kv_cache_backend == "paged",
                    "requires kv_cache_backend='paged' (rejected drafts give their blocks back)")

    def _distributed(self) -> None:
        for name in ("tensor_parallel_size", "data_parallel_size", "nnodes"):
            self._check(name, isinstance(getattr(self, name), int) and getattr(self, name) >= 1, "must be an integer >= 1")
        self._check("load_balance_method", self.load_balance_method in LOAD_BALANCE_METHODS,
                    f"must be one of {', '.join(LOAD_BALANCE_METHODS)}")
        self._check("node_rank", 0 <= self.node_rank < self.nnodes, f"must be in [0, nnodes={self.nnodes})")
        self._check("nnodes", self.tensor_parallel_size % self.nnodes == 0,
                    f"must divide tensor_parallel_size={self.tensor_parallel_size} (each node runs as many ranks)")
        self._check("master_port", 0 < self.master_port < 65536, "must be a TCP port")
        self._check("distributed_timeout_s", self.distributed_timeout_s > 0, "must be > 0")
        self._check("enable_expert_parallel", not self.enable_expert_parallel or self.tensor_parallel_size > 1,
                    "places experts on the tensor-parallel ranks: it needs tensor_parallel_size > 1")
        self._check("draft_model", self.draft_model is None or self.tensor_parallel_size == 1,
                    f"a draft model is not supported with tensor_parallel_size={self.tensor_parallel_size} "
                    "(the drafter is not sharded); use speculative_method='ngram' or tensor_parallel_size=1")

    def _lora(self) -> None:
        on = self.enable_lora
        for name in ("max_loras", "max_lora_rank"):
            self._check(name, isinstance(getattr(self, name), int) and getattr(self, name) >= 1, "must be an integer >= 1")
        self._check("max_cpu_loras", self.max_cpu_loras is None or (isinstance(self.max_cpu_loras, int)
                                                                   and self.max_cpu_loras >= self.max_loras),
                    f"must be None or an integer >= max_loras ({self.max_loras})")
        self._check("lora_modules", not self.lora_modules or on, "requires enable_lora=True")
        self._check("enable_lora", not on or self.resolved_runner == "torch",
                    "LoRA adapters run on the torch runner only (not runner='mlx')")
        for name, path in (self.lora_modules or {}).items():
            self._check("lora_modules", isinstance(name, str) and bool(name) and "=" not in name,
                        f"adapter name {name!r} must be a non-empty string without '='")
            self._check("lora_modules", Path(str(path)).expanduser().is_dir(),
                        f"adapter {name!r}: {path!r} is not a directory (expected a PEFT adapter)")

    @property
    def cpu_loras(self) -> int:
        """Read adapters the runner keeps on the host (a swapped-out adapter comes back without a disk read)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @property
    def speculative_tokens(self) -> int:
        """Drafts per step and request: 0 without speculation."""
        if self.speculative_method is None:
            return 0
        return self.num_speculative_tokens or DEFAULT_SPECULATIVE_TOKENS

    @property
    def decode_rows(self) -> int:
        """The most rows of one decode forward: a verify step decodes each sequence's token and its drafts."""
        return self.max_batch_size * (self.speculative_tokens + 1)

    def _check(self, field: str, ok: bool, message: str) -> None:
        if not ok:
            raise EngineConfigError(f"{field}={getattr(self, field)!r}: {message}")

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if cuda_device_count() else "cpu"  # asked without torch where it can be (engine/devices.py)

    @property
    def resolved_runner(self) -> str:
        """"torch" or "mlx": as asked, or for "auto" mlx on Apple silicon with Metal when device is auto."""
        if self.runner != "auto":
            return self.runner
        from infer.runners.mlx import apple_metal

        return "mlx" if self.device == "auto" and apple_metal() else "torch"

    @property
    def decode_graphs(self) -> bool:
        """Whether decode replays graphs (CUDA graphs on CUDA, recorded kernel calls on the CPU:
        infer/runners/cpu_graphs.py): as asked, or by default with the paged cache and continuous batching."""
        if self.use_cuda_graphs is not None:
            return self.use_cuda_graphs
        return self.kv_cache_backend == "paged" and self.batching_mode == "continuous"

    @property
    def prefill_graphs(self) -> bool:
        """Whether prefill and mixed steps replay CUDA graphs by token bucket: with decode graphs, on CUDA."""
        return self.decode_graphs and self.resolved_device.startswith("cuda")

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype asked for ("auto": bfloat16 on CUDA, float32 elsewhere). The model holds its weights in it, but
        for bfloat16 on the CPU, where only the matmuls' weights are (`matmul_dtype`)."""
        import torch

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        return torch.bfloat16 if self.resolved_device.startswith("cuda") else torch.float32

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the model computes in (activations, KV cache). bfloat16 on the CPU computes in float32 with the
        linear weights held in bfloat16 (`matmul_dtype`): the CPU's bf16 dot products take the matmuls, and every
        other op keeps its float32 kernel (docs/engine.md, "bfloat16 on the CPU")."""
        import torch

        return torch.float32 if self.matmul_dtype is not None else self.weight_dtype

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype: the compute dtype, but bfloat16 for bfloat16 on the CPU (half the bytes a decode
        step's attention reads; the native kernels widen each row exactly as they read it)."""
        return self.matmul_dtype or self.torch_dtype

    @property
    def matmul_dtype(self) -> torch.dtype | None:
        """The dtype linear weights are held in when it differs from the compute dtype (bfloat16 on the CPU)."""
        import torch

        cpu_bf16 = self.weight_dtype == torch.bfloat16 and self.resolved_device == "cpu"
        return torch.bfloat16 if cpu_bf16 and self.resolved_runner != "mlx" else None

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
