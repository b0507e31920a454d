"""Probe scores per output: requests asking for the same probes share one column selection of a step's scores."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from infer.engine.outputs import OutputProcessor
from infer.runners.step import StepResult
from omniscience.bank import ProbeLayout


def _request(names: tuple[str, ...]) -> SimpleNamespace:
    return SimpleNamespace(probe_names=names, sampling_params=SimpleNamespace(probe_stop=None))


def _processor() -> OutputProcessor:
    return OutputProcessor(SimpleNamespace(eos_token_ids=frozenset()), None, 64)  # type: ignore[arg-type]


def test_equal_name_lists_share_one_selection_per_step() -> None:
    layout = ProbeLayout(probes=(), columns={"a": 0, "b": 1, "c": 2}, version=1)
    scores = np.arange(12, dtype=np.float32).reshape(4, 3)
    result = StepResult(token_ids=[1, 2, 3, 4], probe_layout=layout, probe_scores=scores)
    processor = _processor()
    # separately built tuples, as requests naming their probes get them
    outs = [processor._probe_scores(_request(processor.shared_names(tuple(["c", "a"]))), result, row)[0]
            for row in range(4)]
    assert all(o is not None and o is outs[0] for o in outs)  # one selection per step, a row each
    assert [outs[0].as_dict(row) for row in range(4)] == [{"c": c, "a": a} for c, a in [(2, 0), (5, 3), (8, 6), (11, 9)]]
    assert len(processor._columns) == 1


def test_removed_probe_reads_nan_and_a_new_step_selects_again() -> None:
    layout = ProbeLayout(probes=(), columns={"a": 0}, version=2)
    processor = _processor()
    first = StepResult(token_ids=[1], probe_layout=layout, probe_scores=np.array([[0.5]], dtype=np.float32))
    second = StepResult(token_ids=[1], probe_layout=layout, probe_scores=np.array([[0.25]], dtype=np.float32))
    a = processor._probe_scores(_request(("a", "gone")), first, 0)[0]
    b = processor._probe_scores(_request(("a", "gone")), second, 0)[0]
    assert a is not None and b is not None
    assert a.as_dict(0) == {"a": 0.5, "gone": None}
    assert b.as_dict(0) == {"a": 0.25, "gone": None}
