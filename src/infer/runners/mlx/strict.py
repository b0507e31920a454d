"""Step phases of the MLX runner and strict mode (INFER_STRICT_SYNC=1, the variable the CUDA runner reads).

A step goes ENCODE (build the lazy graph: forward, sampling, read-outs), SUBMIT (`mx.async_eval` of the step's
outputs), READBACK (the step boundary: wait once, convert to host values). MLX is lazy, so any evaluation or
conversion of an array to host values inside ENCODE is a hidden wait on the device; in strict mode every such call
raises `SyncInStepError` naming the phase and the call: `mx.eval`, `mx.async_eval` (allowed in SUBMIT),
`mx.synchronize`, `mx.save` and its siblings, an array's `item`, `tolist`, `__array__`, `__bool__`, `__int__`,
`__float__`, `__index__`, `repr` / `str` / `format`, pickling (`__getstate__`), DLPack export, iteration and copies,
`np.array` / `asarray` / `asanyarray` / `frombuffer` / `ascontiguousarray` / `copy` and `torch.as_tensor` / `tensor` /
`from_dlpack` of an MLX array and `memoryview` of one. The phase is per thread; the guards are installed only
while a thread is inside a strict ENCODE or SUBMIT phase and removed when it leaves.

Not caught: a numpy function given an MLX array directly (`np.sum(a)`), which reads it through the buffer protocol in
C, and anything else that does. MLX 0.32 has no evaluation hook or counter to observe a wait with; its memory
counters move with the step's own uploads, so they cannot tell a wait apart (docs/apple.md).
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

import mlx.core as mx
import numpy as np
import torch

from infer.runners.strict_sync import ENV, SyncInStepError, strict_sync_enabled


class Phase(str, Enum):
    IDLE = "idle"  # between steps: anything goes
    ENCODE = "encode"
    SUBMIT = "submit"
    READBACK = "readback"


_local = threading.local()
_lock = threading.Lock()
_installed: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) while any thread is guarded
_guarded_threads = 0

# (owner, attribute, name in errors, phases that allow it, whether only an MLX array argument counts)
_ARRAY_METHODS = ("item", "tolist", "__array__", "__bool__", "__int__", "__float__", "__index__", "__repr__",
                  "__str__", "__format__", "__getstate__", "__dlpack__", "__iter__", "__copy__", "__deepcopy__")
_SAVES = ("save", "savez", "savez_compressed", "save_safetensors", "save_gguf")
_GUARDS: list[tuple[Any, str, str, tuple[Phase, ...], bool]] = [
    (mx, "eval", "mx.eval()", (), False),
    (mx, "async_eval", "mx.async_eval()", (Phase.SUBMIT,), False),
    (mx, "synchronize", "mx.synchronize()", (), False),
    *[(mx, f, f"mx.{f}()", (), False) for f in _SAVES],
    *[(mx.array, m, f"array.{m}()", (), False) for m in _ARRAY_METHODS],
    *[(np, f, f"np.{f}() of an MLX array", (), True) for f in ("array", "asarray", "asanyarray", "frombuffer",
                                                             "ascontiguousarray", "copy")],
    *[(torch, f, f"torch.{f}() of an MLX array", (), True) for f in ("as_tensor", "tensor", "from_dlpack")],
    (builtins, "memoryview", "memoryview() of an MLX array", (), True),
]


def current_phase() -> Phase:
    return getattr(_local, "phase", Phase.IDLE)


def _guard(original: Callable[..., Any], what: str, allowed: tuple[Phase, ...], arrays_only: bool) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        now = current_phase()
        if now in (Phase.ENCODE, Phase.SUBMIT) and now not in allowed and (
                not arrays_only or (args and isinstance(args[0], mx.array))):
            raise SyncInStepError(f"{what} inside the step's {now.value} phase ({ENV}=1): an MLX step evaluates its "
                                  f"outputs once, at the readback")
        return original(*args, **kwargs)

    return guarded


def _install() -> None:
    global _guarded_threads
    with _lock:
        if _guarded_threads == 0:
            for owner, name, what, allowed, arrays_only in _GUARDS:
                original = getattr(owner, name)
                _installed.append((owner, name, original))
                setattr(owner, name, _guard(original, what, allowed, arrays_only))
        _guarded_threads += 1


def _remove() -> None:
    global _guarded_threads
    with _lock:
        _guarded_threads -= 1
        if _guarded_threads == 0:
            while _installed:
                owner, name, original = _installed.pop()
                setattr(owner, name, original)


@contextlib.contextmanager
def phase(now: Phase, strict: bool | None = None) -> Iterator[None]:
    """Run the block in phase `now`; with strict mode (INFER_STRICT_SYNC=1 unless `strict` says) ENCODE and SUBMIT
    raise on any wait or host conversion they do not allow."""
    guarded = (strict_sync_enabled() if strict is None else strict) and now in (Phase.ENCODE, Phase.SUBMIT)
    previous = current_phase()
    _local.phase = now
    if guarded:
        _install()
    try:
        yield
    finally:
        if guarded:
            _remove()
        _local.phase = previous
