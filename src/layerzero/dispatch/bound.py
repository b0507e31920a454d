"""Bound call sites: each call site of a model gets its kernel chosen once and then calls it directly.

`lz.bind(op)` returns a `BoundOp`; the model keeps one per call site (a layer's norm, its q rope, its
paged attention, ...) and calls it with the op's canonical call (the call `lz.explain` takes). The first
call resolves through `dispatch` (same call cache, same engine, same policy) and binds: it keeps the
chosen kernel and a guard generated for that call. Later calls run the guard and, when it holds, the
kernel itself: no context, no cache key, no lookup.

Invariant: a bound call runs the kernel `dispatch` would run for the same call. The guard reads the
facts dispatch's call key reads (shape, stride and dtype of every tensor at the positions and keywords
the op's context reads, the other values there, the first tensor's device, the determinism flag; on
CUDA the capture state, unless the kernel is graph-safe and graph strict mode is off, since a graph-safe
choice made outside a capture is also the choice inside one), and the site re-binds when any of them,
the policy in force (compared by identity) or the selection `GENERATION` (registry, devices, breaker,
tables, tuning) changed. Nothing is bound while the policy asks for debug syncs or the circuit breaker
holds failures: those calls dispatch every time. docs/layerzero.md ("Bound call sites") has the numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from layerzero.dispatch.call import call_key, execute, fallback, resolve
from layerzero.policy.state import get_policy
from layerzero.select.capture import is_capturing
from layerzero.select.engine import Choice, get_engine
from layerzero.select.generation import GENERATION
from layerzero.select.signatures import DEFAULT_SIGNATURE, SIGNATURES, canonical_op

Guard = Callable[[tuple[Any, ...], dict[str, Any]], bool]


class _Binding(NamedTuple):
    generation: int
    policy: object
    guard: Guard
    run: Callable[..., Any]
    choice: Choice
    source: str  # the guard's generated source, for repr and debugging


_UNBOUND = _Binding(-1, None, lambda a, k: False, lambda *a, **k: None, None, "")  # type: ignore[arg-type]


class BoundOp:
    """One call site's kernel (see the module docstring); call it with the op's canonical call."""

    __slots__ = ("op", "_binding", "binds")

    def __init__(self, op: str) -> None:
        self.op = canonical_op(op)
        self._binding = _UNBOUND
        self.binds = 0  # how many times this site (re)selected: 1 in a steady model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self._binding
        if b.generation == GENERATION.value and get_policy() is b.policy and not torch.compiler.is_compiling():
            try:
                hold = b.guard(args, kwargs)
            except Exception:  # a value of another type at a guarded position: not the bound call
                hold = False
            if hold:
                try:
                    return b.run(*args, **kwargs)
                except Exception as exc:
                    return self._failed(b.choice, exc, args, kwargs)
        return self._rebind(args, kwargs)

    @property
    def kernel_id(self) -> str | None:
        """The bound kernel, or None before the first call (or while unbindable)."""
        choice = self._binding.choice
        return None if choice is None else choice.spec.kernel_id

    def __repr__(self) -> str:
        return f"BoundOp({self.op!r}, kernel={self.kernel_id!r}, binds={self.binds})"

    def _rebind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            from layerzero.extend.library import call_op  # imported late: the custom ops call back into dispatch

            return call_op(self.op, *args, **kwargs)
        generation = GENERATION.value  # read first: a change while resolving makes the next call re-bind
        engine = get_engine()
        entry, key = resolve(engine, self.op, args, kwargs)
        choice, sync_after = entry
        self.binds += 1
        if sync_after or engine.breaker.active:
            self._binding = _UNBOUND
        else:
            source, guard = _guard(self.op, args, kwargs, capture=_needs_capture_guard(choice, args))
            run = choice.spec.impl if choice.adaptation.layout is None and choice.adaptation.cast is None else _adapted(choice)
            self._binding = _Binding(generation, get_policy(), guard, run, choice, source)
        return execute(engine, entry, self.op, args, kwargs, key)

    def _failed(self, choice: Choice, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The bound kernel raised: the dispatch fallback chain answers, and the site re-binds next call."""
        self._binding = _UNBOUND
        engine = get_engine()
        return fallback(engine, choice, exc, self.op, args, kwargs, call_key(self.op, args, kwargs, get_policy().key))


def bind(op: str) -> BoundOp:
    """A call site for `op` (a layerzero op id or its dotted spec name): keep it, call it with canonical calls."""
    return BoundOp(op)


def _adapted(choice: Choice) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return choice.run(args, kwargs)

    return run


def _needs_capture_guard(choice: Choice, args: tuple[Any, ...]) -> bool:
    first = next((a for a in args if isinstance(a, Tensor)), None)
    if first is None or not first.is_cuda:
        return False
    return not choice.spec.graph_safe or get_policy().settings.graph_strict_mode or is_capturing(first.device)


def _guard(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, capture: bool) -> tuple[str, Guard]:
    """The guard of one bound call: a function true exactly when a call has this call's key facts.

    The code depends only on the call's structure (which positions hold tensors, None, bools or other values),
    so it is generated once per structure and closed over each binding's expected values.
    """
    sig = SIGNATURES.get(op, DEFAULT_SIGNATURE)
    positions = range(len(args)) if sig.args is None else [i for i in sig.args if i < len(args)]
    slots = [(f"x{i}", f"a[{i}]", args[i]) for i in positions] + [(f"k_{n}", f"k.get({n!r})", kwargs.get(n)) for n in sig.kwargs]
    first = next((name for name, expr, value in slots if isinstance(value, Tensor) and expr.startswith("a[")), None)
    if first is None and sig.args is not None:  # the context takes its device from the first positional tensor
        first = next((f"a[{i}]" for i, a in enumerate(args) if isinstance(a, Tensor)), None)
    kinds = tuple("tensor" if isinstance(v, Tensor) else repr(v) if v is None or isinstance(v, bool) else "value"
                  for _, _, v in slots)
    factory, source = _factory(len(args), tuple((name, expr) for name, expr, _ in slots), kinds, first, capture)
    values: list[Any] = [torch.are_deterministic_algorithms_enabled()]
    for (_, _, value), kind in zip(slots, kinds):
        if kind == "tensor":
            values += [value.shape, value.stride(), value.dtype]
        elif kind == "value":
            values += [type(value), value]
    if first is not None:
        device = (args[int(first[2:-1])] if first.startswith("a[") else args[int(first[1:])]).device
        values.append(device)
        if capture:
            values.append(is_capturing(device))
    return source, factory(*values)


@functools.cache
def _factory(nargs: int, slots: tuple[tuple[str, str], ...], kinds: tuple[str, ...], first: str | None,
             capture: bool) -> tuple[Callable[..., Guard], str]:
    """Generate `make(expected values...) -> guard` for one call structure (cached: structures are few)."""
    params, tests, lines = ["DET"], ["_det() is DET"], [f"if len(a) != {nargs}: return False"]
    for (name, expr), kind in zip(slots, kinds):
        lines.append(f"{name} = {expr}")
        if kind == "tensor":
            params += [f"S_{name}", f"T_{name}", f"D_{name}"]
            tests += [f"{name}.shape == S_{name}", f"{name}.stride() == T_{name}", f"{name}.dtype is D_{name}"]
        elif kind == "value":
            params += [f"Y_{name}", f"V_{name}"]
            tests.append(f"type({name}) is Y_{name} and {name} == V_{name}")
        else:  # None, True or False
            tests.append(f"{name} is {kind}")
    if first is not None:
        params.append("DEV")
        tests.append(f"{first}.device == DEV")
        if capture:
            params.append("CAPTURING")
            tests.append("_capturing(DEV) is CAPTURING")
    body = "\n        ".join([*lines, "return (" + "\n                and ".join(tests) + ")"])
    source = f"def make({', '.join(params)}):\n    def guard(a, k):\n        {body}\n    return guard\n"
    namespace: dict[str, Any] = {"_det": torch.are_deterministic_algorithms_enabled, "_capturing": is_capturing}
    exec(compile(source, "<layerzero bound-call guard>", "exec"), namespace)
    return namespace["make"], source
