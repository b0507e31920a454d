"""lz.tune: time every valid kernel for one canonical call and record the timings in the PerfDB."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from layerzero.perf.measure import device_signature, measure
from layerzero.perf.perfdb import PerfDB, PerfStats, capabilities_hash, get_perfdb
from layerzero.policy.state import get_policy
from layerzero.select.context import SelectionContext
from layerzero.select.engine import SelectionEngine, get_engine
from layerzero.select.errors import LayerZeroError


@dataclass
class TuneResult:
    """What one tune call measured: stats per kernel, the kernels that raised, and the choice afterwards."""

    op: str
    bucket: str
    device_sig: str
    timings: dict[str, PerfStats] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    selected: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "bucket": self.bucket, "device_sig": self.device_sig, "selected": self.selected,
            "failures": self.failures,
            "timings": {k: {"median_us": s.median_us, "p10_us": s.p10_us, "p90_us": s.p90_us, "n": s.n,
                            "confidence": s.confidence} for k, s in self.timings.items()},
        }


def tune(op: str, *args: Any, samples: int | None = None, warmup: int = 3, db: PerfDB | None = None,
         engine: SelectionEngine | None = None, **kwargs: Any) -> TuneResult:
    """Measure every kernel valid for the canonical call `op(*args, **kwargs)`, record it, re-select.

    `samples` defaults to the policy's `perfdb.tune_samples`. Kernels that raise are reported in
    `failures` and not recorded. The engine's caches are cleared so the next dispatch scores with the
    new timings.
    """
    samples = samples if samples is not None else get_policy().settings.perfdb_tune_samples
    db = db if db is not None else get_perfdb()
    if db is None:
        raise LayerZeroError("the PerfDB is disabled (LAYERZERO_PERFDB=off) or could not be opened")
    engine = engine or get_engine()
    ctx = SelectionContext.from_tensors(op, *args, **kwargs)
    device = torch.device(ctx.device)
    result = TuneResult(op, ctx.perf_bucket(), device_signature(device))
    for choice in engine.rank(ctx):
        spec = choice.spec
        try:
            times = measure(lambda: choice.run(args, kwargs), device=device, warmup=warmup, iters=samples)
        except Exception as exc:  # a kernel that cannot run this call is reported, not timed
            result.failures[spec.kernel_id] = repr(exc)
            continue
        result.timings[spec.kernel_id] = db.record(op, spec.kernel_id, result.bucket, result.device_sig, times,
                                                   kernel_version=spec.version, capabilities_hash=capabilities_hash(spec))
    engine.invalidate()
    result.selected = engine.select(ctx).kernel_id
    return result
