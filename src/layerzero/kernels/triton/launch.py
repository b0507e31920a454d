"""Launch helpers shared by the Triton kernels: interpreter detection, tile arithmetic, device facts, and the
launcher that skips Triton's per-call specialization and launches kernels as programmatic dependents.

Programmatic dependent launch (PDL, Hopper and later): a kernel with a `PDL` constexpr is launched so that its
programs may start while the kernel before it in the stream is still finishing, which hides most of a kernel
boundary (launch and ramp) in a decode step's chain of small kernels (benchmarks/reports/pdl_chain_h100.md).
Invariant: such a kernel calls `await_inputs(PDL)` in every program before any other global memory access: it waits
there until the previous kernel has completed and its writes are visible, so nothing is read early and nothing is
overwritten that the previous kernel still reads. Since every dependent waits, a kernel's completion still implies that
of every kernel before it. Two kinds of reads may come before the wait: memory no kernel of a step writes (weights:
`moe_route.py` loads the router early, `norm.py` and `reduce_norm.py` their weights), and what kernels before the
previous one wrote, since the previous kernel lets its dependents launch only once its own wait has returned (`moe.py`'s
decode down projection loads the expert ids the router wrote, and its first weight tile, while the gate+up kernel runs;
`rope_kv.py` the step's rope rows and slots; `paged_attention.py` the context lengths, block tables and the keys and
values of earlier steps). Writes still come after the wait. Each such read takes a memory round trip off the kernel's
critical path (benchmarks/reports/moe_round_trips_h200.md). A program with nothing to do may also return before the
wait, having read only such memory and written nothing, as long as some program of the kernel always waits, so the
kernel's completion still implies its predecessors' (`paged_attention.py`'s splits past a sequence's keys; its split
0 always waits). `LAYERZERO_TRITON_PDL=0` launches every kernel plainly.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1: kernels decorated now run through the interpreter on CPU tensors."""
    return bool(knobs.runtime.interpret)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tile sizes must be powers of two)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact IEEE for float32 inputs (tf32 would miss the 1e-5 contract)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 for CPU tensors under the interpreter); cached."""
    if device.type != "cuda":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def check_paged_caches(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Query [.., H, D] against paged caches [NB, BS, Hkv, D]: GQA group, shapes, unit-stride last dim."""
    n_heads, head_dim, n_kv_heads = query.shape[-2], query.shape[-1], key_cache.shape[2]
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    if key_cache.shape[3] != head_dim or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"caches {tuple(key_cache.shape)} / {tuple(value_cache.shape)} do not fit query {tuple(query.shape)}"
        )
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("KV caches must be contiguous in their last dimension")


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dimension is unit-stride, else a contiguous copy (kernels index d directly)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


@triton.jit
def await_inputs(PDL: tl.constexpr):
    """A PDL kernel's first statement: wait for the previous kernel's writes, then let the next kernel launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


_PDL_ENABLED = os.environ.get("LAYERZERO_TRITON_PDL", "1") != "0"
# the runtime's stream capture must keep programmatic launches as graph edges (edge data came with CUDA 12.3;
# the floor taken leaves one release of margin, tested on 13.0)
PDL_MIN_CUDA = (12, 4)


def _cuda_runtime() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in (torch.version.cuda or "0").split(".")[:2])
    except ValueError:
        return (0,)


@functools.lru_cache(maxsize=None)
def _pdl(index: int) -> bool:
    return _PDL_ENABLED and torch.cuda.get_device_capability(index)[0] >= 9 and _cuda_runtime() >= PDL_MIN_CUDA


def pdl_launch(device: torch.device) -> bool:
    """Whether kernels on `device` launch as programmatic dependents: CUDA SM 9.0+ with a CUDA 12.4+ runtime, not
    interpreted, not disabled."""
    if device.type != "cuda" or interpreting():
        return False
    return _pdl(device.index if device.index is not None else torch.cuda.current_device())


def _fact(arg: Any) -> Any:
    """What Triton specializes a runtime argument on: a tensor's dtype and 16-byte alignment; an int's being 1, its
    divisibility by 16 and whether it fits 32 bits; a float or a bool's type (the device is keyed once a call)."""
    kind = arg.__class__
    if kind is int:
        return arg == 1, arg & 15 == 0, -(2**31) <= arg < 2**31
    if kind is float or arg is None:
        return kind
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() & 15 == 0
    return kind, arg  # a bool, or anything else: keyed on its value


def _plain_fact(arg: Any) -> Any:
    """The fact of an argument in the kernel's `do_not_specialize`: an int only by its width (Triton compiles one
    binary for every value), anything else as `_fact`."""
    if arg.__class__ is int:
        return -(2**31) <= arg < 2**31
    return _fact(arg)


class Launcher:
    """Launches a jitted kernel through the compiled binary of its specialization, kept here.

    `kernel[grid](*args, **constexprs)` re-derives the specialization from every argument on each call and looks
    the binary up by a string key: 10-25 µs of host time a launch on the lent H100 hosts, the largest host cost
    of an eager prefill after cuBLAS (docs/layerzero.md, "Eager prefill and the host cost of a launch"). The key
    holds the same facts (`_fact`), the constexprs and launch options, so a binary is reused exactly when Triton
    would reuse it; the first call of each key goes through Triton (compiling if needed), as every call does under
    the interpreter.
    Runtime arguments come positionally, the first a tensor (its device is keyed), constexprs and launch options
    (num_warps, num_stages) by keyword. A kernel with a `PDL` constexpr gets it here, with the launch option, from
    `pdl_launch` of the first tensor's device (see the module docstring)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names: list[str] = list(kernel.arg_names)
        self.pdl = "PDL" in self.names
        plain = {p.num for p in getattr(kernel, "params", ()) if p.do_not_specialize}
        self.facts = [_plain_fact if i in plain else _fact for i in range(len(self.names))]
        self.compiled: dict[tuple, tuple[Any, list[Any]]] = {}  # key -> (binary, constexpr values in order)

    def __call__(self, grid: tuple[int, ...], *args: Any, **keywords: Any) -> None:
        if interpreting():
            self.kernel[grid](*args, **({"PDL": False} if self.pdl else {}), **keywords)
            return
        if self.pdl:
            pdl = pdl_launch(args[0].device)
            keywords.update(PDL=pdl, launch_pdl=pdl)
        key = (args[0].get_device(), tuple(f(a) for f, a in zip(self.facts, args)), tuple(keywords.items()))
        entry = self.compiled.get(key)
        if entry is None:
            binary = self.kernel[grid](*args, **keywords)
            if binary is not None:  # an interpreted kernel returns no binary: it goes through Triton every call
                self.compiled[key] = binary, [keywords[name] for name in self.names[len(args):]]
            return
        binary, constexprs = entry
        grid3 = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        binary[grid3](*args, *constexprs)
