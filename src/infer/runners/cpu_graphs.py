"""CPU decode graphs: each batch-size bucket's decode forward recorded once, then replayed without Python per op.

A CPU decode step of a small model spends as long in Python (module calls, bound sites, the native wrappers making
outputs and reading pointers) as in its C kernels. Here, as with a CUDA graph, a bucket's forward runs once eagerly
(kernels are selected, weights converted), once under a recorder, and from then on as a replay of what was recorded:
- every native kernel call, in order: its ctypes function and arguments (pointers, sizes: layerzero's
  `calls_into`);
- every tensor op that computes (a view or an allocation computes nothing: its tensor keeps the memory it got), as
  the same op again with its output copied where the recorded output lives; in-place ops as themselves.
Every tensor made while recording is kept, so each pointer stays valid and each output lands where the next op
reads it, the way a CUDA graph keeps its pool. The inputs are DecodeBuffers' fixed tensors, attention is bounded by
the buffers' capacity, and the result is the recorded logits tensor, overwritten by the next replay.

Invariant: a replay runs the kernels the recorded forward ran, on the same memory. A recording is dropped when
layerzero could choose differently (its policy object or selection GENERATION changed) and is made again two
forwards later. A forward that needs a tensor's value on the host (`.item()`, a shape that depends on values) cannot
be replayed: its bucket stays eager. (`.tolist()` and `.numpy()` read CPU memory without an op the recorder sees:
the decode forward must not use them, as a CUDA graph's forward must not sync.) A replay runs no Python, so while
any forward hook is registered (on a module of the model, or globally) decode steps run eagerly and the hooks see
every one. docs/engine.md, "CPU decode graphs".
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from infer.runners.cuda_graphs import GraphStats, smallest_bucket
from layerzero import GENERATION, KernelCall, calls_into, get_policy

# Each bucket keeps its own activations (~1.7 MB a row for the bundled model); 32 is the default max_batch_size, and
# replays measured 1.54x eager at batch 1, 1.1x at 8, even at 32 (benchmarks/reports/cpu_graphs.md).
MAX_CPU_GRAPH_BATCH = 32
_ALLOCATIONS = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided, torch.ops.aten.new_empty,
                torch.ops.aten.new_empty_strided}


def _tensors(value: object) -> list[torch.Tensor] | None:
    """An op's tensor outputs, or None when it returned a host value."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def _run_into(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[torch.Tensor]) -> None:
    """Run a functional op again and put its result where the recorded one lives."""
    fresh = func(*args, **kwargs)
    for out, value in zip(outs, [fresh] if isinstance(fresh, torch.Tensor) else fresh):
        out.copy_(value)


def _copy_into(out: torch.Tensor, src: torch.Tensor) -> None:
    out.copy_(src)


def _cast(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outs: list[torch.Tensor]) -> bool:
    """A dtype cast of a CPU tensor (aten.to.dtype under inference mode, aten._to_copy otherwise): replayed as one
    copy_ into its recorded output, not as a cast into a new tensor and then a copy (the bf16 path's casts around
    each matmul: 242 a decode step of the bundled model)."""
    if func is torch.ops.aten.to.dtype:
        extra = args[2:] + tuple(kwargs.values())
        if any(bool(v) for v in extra if not isinstance(v, torch.memory_format)):  # non_blocking / copy flags
            return False
    elif func is not torch.ops.aten._to_copy.default or set(kwargs) - {"dtype", "device", "layout"} or len(args) != 1:
        return False
    src = args[0]
    return (isinstance(src, torch.Tensor) and src.device.type == "cpu" and len(outs) == 1
            and outs[0].device.type == "cpu" and outs[0].shape == src.shape
            and kwargs.get("layout") in (None, torch.strided) and outs[0].data_ptr() != src.data_ptr())


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    func(*args, **kwargs)


class _Recorder(TorchDispatchMode):
    """Runs each tensor op and appends what a replay must run to `ops`; keeps every tensor it sees made."""

    def __init__(self, ops: list[KernelCall]) -> None:
        super().__init__()
        self.ops = ops
        self.kept: list[torch.Tensor] = []
        self.refusal: str | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing records under torch.compile: without this, torch wraps __torch_dispatch__ in a dynamo guard whose
        # first call imports torch._dynamo (1.4 s of a CPU core's warm-up on a 2-core Zen 3)
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = _tensors(out)
        if outs is None:
            self.refusal = self.refusal or f"{func} returns a host value"
            return out
        if torch.Tag.dynamic_output_shape in func.tags and not _integer_index(func, args):
            self.refusal = self.refusal or f"{func}'s output shape depends on values"
        self.kept += outs
        schema = func._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            self.ops.append((_run, (func, args, kwargs)))  # in place or out=: it writes the same memory again
        elif func.overloadpacket in _ALLOCATIONS:
            pass
        elif _cast(func, args, kwargs, outs):  # a dtype cast: one copy_ into the recorded output casts and places it
            self.ops.append((_copy_into, (outs[0], args[0])))
        elif not any(r.alias_info is not None for r in schema.returns) or not _views(outs, args, kwargs):
            # a computed result; or an op that may return a view but copied (reshape, contiguous, under inference mode)
            self.ops.append((_run_into, (func, args, kwargs, outs)))
        return out


def _views(outs: list[torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether every output shares memory with an input (so there is nothing to compute again)."""
    inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    return all(out.untyped_storage().data_ptr() in inputs for out in outs)


def _integer_index(func: Any, args: tuple[Any, ...]) -> bool:
    """aten.index with integer index tensors: its output shape is the indices' shape, whatever their values."""
    return func is torch.ops.aten.index.Tensor and all(
        i is None or not (i.dtype == torch.bool or i.dtype == torch.uint8) for i in args[1])


@dataclass
class _Recording:
    ops: list[KernelCall]
    kept: list[torch.Tensor]
    logits: torch.Tensor
    generation: int
    policy: object
    seconds: float

    def replay(self) -> torch.Tensor:
        for fn, args in self.ops:
            status = fn(*args)
            if status:  # a native kernel's nonzero status (tensor ops and void kernels return None)
                raise RuntimeError(f"native kernel {fn.__name__} failed (status {status}) in a CPU graph replay")
        return self.logits

    @property
    def nbytes(self) -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.kept}
        return sum(storages.values())


class CpuDecodeGraphs:
    """Recorded decode forwards keyed by padded batch size (the interface of CudaGraphs)."""

    def __init__(self, forward: Callable[[int], torch.Tensor], sizes: tuple[int, ...],
                 model: nn.Module | None = None) -> None:
        self.sizes = tuple(s for s in sizes if s <= MAX_CPU_GRAPH_BATCH)
        self._modules = [] if model is None else list(model.modules())  # whose hooks make a step eager
        # a runner's method is held weakly: the runner owns its graphs, and a cycle would keep its KV cache alive
        # until a full garbage collection
        self._forward_ref = weakref.WeakMethod(forward) if inspect.ismethod(forward) else lambda: forward
        self._recordings: dict[int, _Recording] = {}
        self._warm: set[int] = set()  # buckets whose forward ran eagerly since the last (dropped) recording
        self.eager: dict[int, str] = {}  # buckets that cannot be replayed, and why

    @property
    def stats(self) -> GraphStats:
        recorded = self._recordings.values()
        return GraphStats(tuple(sorted(self._recordings)), sum(r.seconds for r in recorded),
                          sum(r.nbytes for r in recorded))

    def bucket(self, rows: int) -> int | None:
        """The smallest bucket holding `rows` sequences, or None (run eagerly)."""
        return smallest_bucket(self.sizes, rows)

    def _hooked(self) -> bool:
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return True
        return any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)

    def _forward(self, size: int) -> torch.Tensor:
        forward = self._forward_ref()
        if forward is None:
            raise RuntimeError("the runner of these CPU decode graphs is gone")
        return forward(size)

    def replay(self, size: int) -> torch.Tensor:
        """The logits [size, vocab] of the decode forward for `size` rows: replayed once recorded (overwritten by the
        next replay), else run eagerly or recorded."""
        if self._hooked():  # hooks are Python a replay would skip
            return self._forward(size)
        recording = self._recordings.get(size)
        policy = get_policy()
        if recording is not None and recording.generation == GENERATION.value and recording.policy is policy:
            return recording.replay()
        if recording is not None:  # selection may differ now: warm up and record again
            del self._recordings[size]
            self._warm.discard(size)
        if size in self.eager or size not in self._warm:
            self._warm.add(size)
            return self._forward(size)
        return self._record(size, policy)

    def _record(self, size: int, policy: object) -> torch.Tensor:
        started = time.perf_counter()
        generation = GENERATION.value
        ops: list[KernelCall] = []
        recorder = _Recorder(ops)
        with calls_into(ops), recorder:
            logits = self._forward(size)
        if recorder.refusal is not None:
            self.eager[size] = recorder.refusal
        else:
            self._recordings[size] = _Recording(ops, recorder.kept, logits, generation, policy,
                                                time.perf_counter() - started)
        return logits
