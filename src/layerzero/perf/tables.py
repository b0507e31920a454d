"""Dispatch tables: `warmup` runs known calls once, `solve` bakes their choices per bucket.

A table maps (op, a digest of the context's exact validity fields, the bucketed sizes) to a kernel id and
carries the hardware signature it was solved on. Installed with `use(table)`, the selection engine takes
the table's kernel for calls inside its buckets (still checking that kernel's constraints and the policy's
locks and blocks) and selects at run time outside them. On other hardware the table is ignored with a
warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from layerzero.perf.measure import device_signature
from layerzero.select.context import BATCH_BUCKETS, SEQ_BUCKETS, SelectionContext
from layerzero.select.engine import SelectionEngine, get_engine
from layerzero.select.errors import LayerZeroError

SCHEMA_VERSION = "1.0"

Call = tuple[str, Sequence[Any], dict[str, Any]]  # (op, canonical positional args, canonical keyword args)


def validity_digest(ctx: SelectionContext) -> str:
    """Stable digest of the exact validity fields, without the device index (the signature covers the device)."""
    fields = ctx.with_(device=ctx.platform).validity_key()
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


@dataclass
class DispatchTable:
    """Bucketed kernel choices solved on one kind of hardware."""

    hardware_signature: str
    plans: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (op, validity, bucket) -> kernel_id
    model_id: str = ""
    _warned: set[str] = field(default_factory=set, repr=False)

    def lookup(self, ctx: SelectionContext) -> str | None:
        """The baked kernel id for ctx, or None (outside the buckets, or other hardware: warned once)."""
        sig = device_signature(ctx.device)
        if sig != self.hardware_signature:
            if sig not in self._warned:
                self._warned.add(sig)
                warnings.warn(f"layerzero dispatch table solved on {self.hardware_signature!r} ignored on {sig!r}; "
                              "selecting at run time", RuntimeWarning, stacklevel=2)
            return None
        return self.plans.get((ctx.op, validity_digest(ctx), ctx.perf_bucket()))

    def to_dict(self) -> dict[str, Any]:
        """Appendix E layout: one plan per bucket, each listing its ops."""
        by_bucket: dict[str, list[dict[str, str]]] = {}
        for (op, validity, bucket), kernel_id in sorted(self.plans.items()):
            by_bucket.setdefault(bucket, []).append({"op": op, "validity": validity, "kernel_id": kernel_id})
        return {
            "schema_version": SCHEMA_VERSION,
            "model_id": self.model_id,
            "hardware_signature": self.hardware_signature,
            "shape_buckets": {"seq_len": list(SEQ_BUCKETS), "batch": list(BATCH_BUCKETS)},
            "plans": [{"bucket": bucket, "ops": ops} for bucket, ops in by_bucket.items()],
            "fallback": {"mode": "runtime_select"},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DispatchTable:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise LayerZeroError(f"dispatch table schema {data.get('schema_version')!r}, expected {SCHEMA_VERSION!r}")
        if data.get("shape_buckets") != {"seq_len": list(SEQ_BUCKETS), "batch": list(BATCH_BUCKETS)}:
            raise LayerZeroError("dispatch table was solved with other shape buckets")
        plans = {(op["op"], op["validity"], plan["bucket"]): op["kernel_id"] for plan in data["plans"] for op in plan["ops"]}
        return cls(data["hardware_signature"], plans, data.get("model_id", ""))

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DispatchTable:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


def warmup(calls: Iterable[Call], *, tune: bool = False, engine: SelectionEngine | None = None) -> list[tuple[SelectionContext, str]]:
    """Select (after timing every candidate when `tune`) and run each canonical call once, compiling any
    JIT kernel before serving; returns each call's context and chosen kernel id."""
    engine = engine or get_engine()
    done = []
    for op, args, kwargs in calls:
        if tune:
            from layerzero.perf.tune import tune as tune_call

            tune_call(op, *args, engine=engine, **kwargs)
        ctx = SelectionContext.from_tensors(op, *args, **kwargs)
        choice = engine.choose(ctx)
        choice.run(tuple(args), kwargs)
        done.append((ctx, choice.spec.kernel_id))
    return done


def solve(calls: Iterable[Call], *, model_id: str = "", tune: bool = False,
          engine: SelectionEngine | None = None) -> DispatchTable:
    """Warm up every call and bake its choice into a DispatchTable for its bucket (all calls on one device)."""
    done = warmup(calls, tune=tune, engine=engine)
    if not done:
        raise LayerZeroError("solve needs at least one call")
    devices = {ctx.device for ctx, _ in done}
    if len(devices) != 1:
        raise LayerZeroError(f"solve takes calls on one device, got {sorted(devices)}")
    table = DispatchTable(device_signature(torch.device(devices.pop())), model_id=model_id)
    for ctx, kernel_id in done:
        table.plans[(ctx.op, validity_digest(ctx), ctx.perf_bucket())] = kernel_id
    return table


def use(table: DispatchTable | None, engine: SelectionEngine | None = None) -> None:
    """Install a table in the engine (None removes it); cached selections are dropped."""
    engine = engine or get_engine()
    engine.table = table
    engine.invalidate()
