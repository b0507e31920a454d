"""dispatch(op, *args, **kwargs): context -> select -> run, with runtime fallback and the circuit breaker.

Hot path: the call cache maps the exact metadata of the arguments the op's context reads (shapes, dtypes,
devices, strides, the keyword values that matter), the policy key, the determinism flag and the capture
state to a Choice; a hit runs the kernel directly. A miss builds the SelectionContext and asks the engine.

When the chosen kernel raises, the next valid candidates run in score order (the reference last); the
first one that succeeds answers, the failed backends are charged to the circuit breaker and ONE warning
per (op, kernel, call key) says so. If every candidate raises, the inputs are at fault: the breaker is
left alone and the last error is raised as is.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from layerzero.policy.state import get_policy
from layerzero.select.cache import LRUCache
from layerzero.select.capture import is_capturing
from layerzero.select.context import SelectionContext
from layerzero.select.engine import Choice, SelectionEngine, get_engine
from layerzero.select.errors import KernelExecutionError
from layerzero.select.signatures import DEFAULT_SIGNATURE, SIGNATURES


class FallbackWarning(RuntimeWarning):
    """A kernel raised at run time and another candidate answered instead."""


_warned: LRUCache[bool] = LRUCache(4096)


def call_key(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], policy_key: str) -> tuple[Any, ...]:
    """The call-cache key: everything SelectionContext.from_tensors reads for this op, plus global state.

    Tensors contribute shape, stride and dtype; the device (and the capture state) come from the first
    tensor, as in the context; other values contribute themselves (lists as tuples).
    """
    sig = SIGNATURES.get(op, DEFAULT_SIGNATURE)
    key: list[Any] = [op, policy_key, torch.are_deterministic_algorithms_enabled()]
    first = None
    if sig.args is None:
        for a in args:
            if isinstance(a, Tensor):
                key += (a.shape, a.stride(), a.dtype)
                first = first if first is not None else a
            else:
                key.append(None)
    else:
        n = len(args)
        for i in sig.args:
            a = args[i] if i < n else None
            if isinstance(a, Tensor):
                key += (a.shape, a.stride(), a.dtype)
                first = first if first is not None else a
            else:
                key.append(tuple(a) if isinstance(a, list) else a)
    for name in sig.kwargs:
        a = kwargs.get(name)
        if isinstance(a, Tensor):
            key += (a.shape, a.stride(), a.dtype)
        else:
            key.append(a)
    if first is not None:
        device = first.device
        key.append(device)
        if first.is_cuda:  # the common case (tensor on the current device) without layerzero.select.graphs' detour
            same = device.index == torch.cuda.current_device()
            key.append(torch.cuda.is_current_stream_capturing() if same else is_capturing(device))
    return tuple(key)


def _select(engine: SelectionEngine, op: str, args: tuple[Any, ...], kwargs: dict[str, Any],
            key: tuple[Any, ...], sync_after: bool) -> tuple[Choice, bool]:
    """A call-cache miss: build the context, let the engine choose, cache the entry under the call key."""
    ctx = SelectionContext.from_tensors(op, *args, **kwargs)
    entry = (engine.choose(ctx), sync_after)
    engine.call_cache.put(key, entry)
    return entry


def fallback(engine: SelectionEngine, failed: Choice, error: Exception, op: str, args: tuple[Any, ...],
              kwargs: dict[str, Any], key: tuple[Any, ...]) -> Any:
    policy = get_policy()
    if failed.locked or not policy.fallback_enabled:
        raise KernelExecutionError(f"{failed.spec.kernel_id} failed for {op}: {error!r}") from error
    ctx = SelectionContext.from_tensors(op, *args, **kwargs)
    failures: list[tuple[Choice, Exception]] = [(failed, error)]
    for choice in engine.rank(ctx):
        if choice.spec is failed.spec:
            continue
        try:
            out = choice.run(args, kwargs)
        except Exception as exc:  # try the next candidate
            failures.append((choice, exc))
            continue
        for bad, exc in failures:
            engine.breaker.record_failure(bad.spec.backend, exc)
            _warn_once(op, bad.spec.kernel_id, key, choice.spec.kernel_id, exc)
        engine.sync()
        return out
    raise failures[-1][1]


def _warn_once(op: str, kernel_id: str, key: tuple[Any, ...], used: str, exc: Exception) -> None:
    if not _warned.add((op, kernel_id, key), True):
        return
    warnings.warn(f"layerzero: {kernel_id} raised {exc!r} for {op}; {used} answered instead", FallbackWarning,
                  stacklevel=4)


def resolve(engine: SelectionEngine, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> tuple[tuple[Choice, bool], tuple[Any, ...]]:
    """The call-cache entry (choice, sync after the run) of a canonical call, selecting on a miss, and its key."""
    engine.sync()
    policy = get_policy()
    key = call_key(op, args, kwargs, policy.key)
    entry = engine.call_cache.get(key)
    if entry is None:
        entry = _select(engine, op, args, kwargs, key, policy.settings.debug_sync)
    return entry, key


def execute(engine: SelectionEngine, entry: tuple[Choice, bool], op: str, args: tuple[Any, ...],
            kwargs: dict[str, Any], key: tuple[Any, ...]) -> Any:
    """Run a resolved call: the chosen kernel, or the fallback chain when it raises (see the module docstring)."""
    choice, sync_after = entry
    try:
        out = choice.run(args, kwargs)
    except Exception as exc:
        out = fallback(engine, choice, exc, op, args, kwargs, key)
    else:
        if engine.breaker.active:
            engine.breaker.record_success(choice.spec.backend)
    if sync_after:
        device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        if device is not None:
            torch.cuda.synchronize(device)
    return out


def dispatch(op: str, *args: Any, **kwargs: Any) -> Any:
    """Select the kernel for this canonical call and run it (see the module docstring)."""
    engine = get_engine()
    entry, key = resolve(engine, op, args, kwargs)
    return execute(engine, entry, op, args, kwargs, key)
