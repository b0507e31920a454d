"""Bound call sites: each call site of a model gets its kernel chosen once and then calls it directly.

`lz.bind(op)` returns a `BoundOp`; the model keeps one per call site (a layer's norm, its q rope, its
paged attention, ...) and calls it with the op's canonical call (the call `lz.explain` takes). The first
call resolves through `dispatch` (same call cache, same engine, same policy) and binds: it keeps the
chosen kernel and a guard generated for that call. Later calls run the guard and, when it holds, the
kernel itself: no context, no cache key, no lookup. The guard is generated code, one class per call
structure (which positions hold tensors, None, flags or other values) whose `__call__` checks the
binding's expected values inline and calls the kernel: one Python frame between the model and the kernel.

Invariant: a bound call runs the kernel `dispatch` would run for the same call. The guard reads the
facts dispatch's call key reads (shape, stride and dtype of every tensor at the positions and keywords
the op's context reads, the other values there, the first tensor's device, the determinism flag; on
CUDA the capture state, unless the kernel is graph-safe and graph strict mode is off, since a graph-safe
choice made outside a capture is also the choice inside one), and the site re-binds when any of them,
the policy in force (compared by identity) or the selection `GENERATION` (registry, devices, breaker,
tables, tuning) changed. Nothing is bound while the policy asks for debug syncs or the circuit breaker
holds failures: those calls dispatch every time. Inside `lz.plan(signature)` (layerzero.dispatch.plan) a
site vouched for the pass's token skips its guard altogether. docs/layerzero.md ("Bound call sites").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from layerzero.dispatch.call import call_key, execute, fallback, resolve
from layerzero.dispatch.plan import CURRENT, Pass
from layerzero.policy.state import get_policy
from layerzero.select.capture import is_capturing
from layerzero.select.engine import Choice, get_engine
from layerzero.select.generation import GENERATION
from layerzero.select.signatures import DEFAULT_SIGNATURE, SIGNATURES, canonical_op

RECENT = 3  # bindings a site keeps besides the current one
_NOBODY = object()  # the token of no plan: what an unvouched site holds
_NEVER = ("never",)  # a site called twice in one pass: never vouched
_compiling = torch.compiler.is_compiling
_deterministic = torch._C._get_deterministic_algorithms  # what torch.are_deterministic_algorithms_enabled returns


class BoundOp:
    """One call site's kernel (see the module docstring); call it with the op's canonical call.

    Unbound, every call resolves and binds; bound, the instance's class is the generated one for the call's
    structure and `_binding` holds (generation, policy, kernel, choice, expected values...). The last few
    other bindings wait in `_recent`, so a site that alternates between signatures (a prefill shape and the
    decode shape in mixed serving) switches back without selecting again."""

    __slots__ = ("op", "binds", "_binding", "_recent", "_vouched", "_seen")
    guard_source = ""  # the generated __call__ of a bound site's class

    def __init__(self, op: str) -> None:
        self.op = canonical_op(op)
        self.binds = 0  # how many times this site (re)selected: once per call signature in a steady model
        self._binding: tuple[Any, ...] = ()
        self._recent: list[tuple[type[BoundOp], tuple[Any, ...]]] = []
        self._vouched: object = _NOBODY  # the plan token under which the current binding runs unguarded
        self._seen: tuple[Any, ...] | None = None  # (token, pass serial) of the last guarded call in a pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._rebind(args, kwargs)

    @property
    def kernel_id(self) -> str | None:
        """The bound kernel, or None before the first call (or while nothing may be bound)."""
        return self._binding[3].spec.kernel_id if self._binding else None

    @property
    def vouched(self) -> bool:
        """Whether a plan token vouches for the current binding (its calls under that plan skip the guard)."""
        return self._vouched is not _NOBODY

    def __repr__(self) -> str:
        return f"BoundOp({self.op!r}, kernel={self.kernel_id!r}, binds={self.binds}, vouched={self.vouched})"

    def _rebind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _compiling():
            from layerzero.extend.library import call_op  # imported late: the custom ops call back into dispatch

            return call_op(self.op, *args, **kwargs)
        if self._binding:  # keep the binding this call missed among the recent ones
            self._recent = [(type(self), self._binding), *self._recent[: RECENT - 1]]
        policy = get_policy()
        for i, (cls, binding) in enumerate(self._recent):
            if binding[0] == GENERATION.value and binding[1] is policy and cls.holds(binding, args, kwargs):
                del self._recent[i]
                self.__class__, self._binding, self._vouched = cls, binding, _NOBODY
                self._vouch(CURRENT.get())
                try:
                    return binding[2](*args, **kwargs)
                except Exception as exc:
                    return self._failed(binding[3], exc, args, kwargs)
        engine = get_engine()
        engine.sync()  # settled first (the registry's first fill, expired cool-downs move GENERATION)
        generation = GENERATION.value  # read before resolving: a change while resolving makes the next call re-bind
        entry, key = resolve(engine, self.op, args, kwargs)
        choice, sync_after = entry
        self.binds += 1
        self._unbind()
        if not sync_after and not engine.breaker.active:
            cls, values = _specialize(self.op, args, kwargs, capture=_needs_capture_guard(choice, args))
            run = choice.spec.impl if choice.adaptation.layout is None and choice.adaptation.cast is None else _adapted(choice)
            self._binding = (generation, get_policy(), run, choice, *values)
            self.__class__ = cls
            self._vouch(CURRENT.get())
        return execute(engine, entry, self.op, args, kwargs, key)

    def _unbind(self) -> None:
        self.__class__ = BoundOp
        self._binding = ()
        self._vouched = _NOBODY

    def reset(self) -> None:
        """Forget every binding (current, recent, plan trust): the next call selects through dispatch."""
        self._unbind()
        self._recent, self._seen = [], None

    def _vouch(self, current: Pass | None) -> None:
        """A guarded call held under a plan pass: trust the pass's token from the second pass that sees this site
        called once."""
        seen = self._seen
        if current is None or seen is _NEVER:
            return
        if seen is not None and seen[0] is current.token:
            if seen[1] == current.serial:  # twice in one pass: its calls differ within a pass, so never trust
                self._seen, self._vouched = _NEVER, _NOBODY
            else:
                self._vouched = current.token
        else:
            self._seen = (current.token, current.serial)

    @staticmethod
    def holds(binding: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether a call has the facts `binding` expects (generated per call structure, like `__call__`)."""
        return False

    def _failed(self, choice: Choice, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The bound kernel raised: the dispatch fallback chain answers, and the site re-binds next call."""
        self.reset()
        engine = get_engine()
        return fallback(engine, choice, exc, self.op, args, kwargs, call_key(self.op, args, kwargs, get_policy().key))


def bind(op: str) -> BoundOp:
    """A call site for `op` (a layerzero op id or its dotted spec name): keep it, call it with canonical calls."""
    return BoundOp(op)


def sites_of(module: torch.nn.Module) -> dict[str, BoundOp]:
    """Every bound site in a module tree by path: attributes that are sites, and sites in an attribute's slots
    (a holder of several, such as a projection's dense and 4-bit pair)."""
    out = {}
    for name, sub in module.named_modules():
        for attr, value in vars(sub).items():
            inner = [(attr, value)] if isinstance(value, BoundOp) else \
                [(f"{attr}.{s}", getattr(value, s, None)) for s in getattr(type(value), "__slots__", ())]
            out.update({f"{name}.{path}" if name else path: site for path, site in inner if isinstance(site, BoundOp)})
    return out


def _adapted(choice: Choice) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return choice.run(args, kwargs)

    return run


def _needs_capture_guard(choice: Choice, args: tuple[Any, ...]) -> bool:
    first = next((a for a in args if isinstance(a, Tensor)), None)
    if first is None or not first.is_cuda:
        return False
    return not choice.spec.graph_safe or get_policy().settings.graph_strict_mode or is_capturing(first.device)


def _specialize(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, capture: bool) -> tuple[type[BoundOp], list[Any]]:
    """The bound class for this call's structure and the values its guard expects (the facts dispatch keys on)."""
    sig = SIGNATURES.get(op, DEFAULT_SIGNATURE)
    positions = range(len(args)) if sig.args is None else [i for i in sig.args if i < len(args)]
    slots = [(f"x{i}", f"args[{i}]", args[i]) for i in positions]
    slots += [(f"k_{n}", f"kwargs.get({n!r})", kwargs.get(n)) for n in sig.kwargs]
    first = next((name for name, expr, value in slots if isinstance(value, Tensor) and expr.startswith("args")), None)
    device = next((v for n, _, v in slots if n == first), None)
    if first is None and sig.args is not None:  # the context takes its device from the first positional tensor
        index = next((i for i, a in enumerate(args) if isinstance(a, Tensor)), None)
        first, device = (None, None) if index is None else (f"args[{index}]", args[index])
    kinds = tuple("tensor" if isinstance(v, Tensor) else repr(v) if v is None or isinstance(v, bool) else "value"
                  for _, _, v in slots)
    values: list[Any] = [_deterministic()]
    for (_, _, value), kind in zip(slots, kinds):
        if kind == "tensor":
            values += [value.shape, value.stride(), value.dtype]
        elif kind == "value":
            values += [type(value), value]
    if device is not None:
        values.append(device.device)
        if capture:
            values.append(is_capturing(device.device))
    cls = _bound_class(len(args) if sig.args is None else None, tuple((name, expr) for name, expr, _ in slots), kinds, first, capture and device is not None)
    return cls, values


@functools.cache
def _bound_class(nargs: int | None, slots: tuple[tuple[str, str], ...], kinds: tuple[str, ...], first: str | None,
                 capture: bool) -> type[BoundOp]:
    """Generate the BoundOp subclass for one call structure (cached: a model has a handful of structures)."""
    # a missing position raises IndexError (not the bound call); extra ones are outside the key, as in dispatch,
    # except for ops keyed on every positional argument (nargs given)
    names, tests = ["DET"], ([] if nargs is None else [f"len(args) == {nargs}"]) + ["_deterministic() is DET"]
    for (name, expr), kind in zip(slots, kinds):
        if kind == "tensor":
            names += [f"S_{name}", f"T_{name}", f"D_{name}"]
            tests += [f"({name} := {expr}).shape == S_{name}", f"{name}.stride() == T_{name}", f"{name}.dtype is D_{name}"]
        elif kind == "value":
            names += [f"Y_{name}", f"V_{name}"]
            tests.append(f"type({name} := {expr}) is Y_{name} and {name} == V_{name}")
        else:  # None, True or False
            tests.append(f"{expr} is {kind}")
    if first is not None:
        names.append("DEV")
        tests.append(f"{first}.device == DEV")
        if capture:
            names.append("CAPTURING")
            tests.append("_capturing(DEV) is CAPTURING")
    source = (
        "def __call__(self, *args, **kwargs):\n"
        "    current = _current()\n"
        "    if current is not None and current.token is self._vouched:  # vouched by the caller's plan\n"
        "        binding = self._binding\n"
        "        try:\n"
        "            return binding[2](*args, **kwargs)\n"
        "        except Exception as exc:\n"
        "            return self._failed(binding[3], exc, args, kwargs)\n"
        "    try:  # a value of another type at a guarded position, or a binding being swapped: not the bound call\n"
        f"        generation, policy, run, choice, {', '.join(names)} = self._binding\n"
        "        hold = (generation == GENERATION.value and get_policy() is policy and not _compiling()\n"
        "                and " + "\n                and ".join(tests) + ")\n"
        "    except Exception:\n"
        "        hold = False\n"
        "    if hold:\n"
        "        if current is not None:\n"
        "            self._vouch(current)\n"
        "        try:\n"
        "            return run(*args, **kwargs)\n"
        "        except Exception as exc:\n"
        "            return self._failed(choice, exc, args, kwargs)\n"
        "    return self._rebind(args, kwargs)\n"
        "\n\n"
        "def holds(binding, args, kwargs):\n"
        f"    generation, policy, run, choice, {', '.join(names)} = binding\n"
        "    try:\n"
        "        return (" + "\n                and ".join(tests) + ")\n"
        "    except Exception:\n"
        "        return False\n"
    )
    namespace: dict[str, Any] = {"_current": CURRENT.get, "GENERATION": GENERATION, "get_policy": get_policy, "_compiling": _compiling,
                                 "_deterministic": _deterministic, "_capturing": is_capturing}
    exec(compile(source, "<layerzero bound call>", "exec"), namespace)
    return type("BoundOp", (BoundOp,), {"__slots__": (), "__call__": namespace["__call__"],
                                        "holds": staticmethod(namespace["holds"]), "guard_source": source,
                                        "__module__": __name__})
