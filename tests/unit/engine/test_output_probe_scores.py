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
    return OutputProcessor(frozenset(), None, 64)  # type: ignore[arg-type]


def test_equal_name_lists_share_one_selection_per_step() -> None:
    layout = ProbeLayout(probes=(), columns={"a": 0, "b": 1, "c": 2}, version=1)
    scores = np.arange(12, dtype=np.float32).reshape(4, 3)
    result = StepResult(token_ids=[1, 2, 3, 4], probe_layout=layout, probe_scores=scores)
    processor = _processor()
    # separately built tuples, as requests naming their probes get them
    outs = [processor._probe_scores(_request(processor.shared_names(tuple(["c", "a"]))), result, row)[0]
            for row in range(4)]
    assert outs == [[2, 0], [5, 3], [8, 6], [11, 9]]  # each row's values, in the asked order
    assert len(processor._selections) == 1 and len(processor._columns) == 1  # one selection per step


def test_removed_probe_reads_none_and_a_new_step_selects_again() -> None:
    layout = ProbeLayout(probes=(), columns={"a": 0}, version=2)
    processor = _processor()
    first = StepResult(token_ids=[1], probe_layout=layout, probe_scores=np.array([[0.5]], dtype=np.float32))
    second = StepResult(token_ids=[1], probe_layout=layout, probe_scores=np.array([[0.25]], dtype=np.float32))
    a = processor._probe_scores(_request(("a", "gone")), first, 0)[0]
    b = processor._probe_scores(_request(("a", "gone")), second, 0)[0]
    assert a == [0.5, None] and b == [0.25, None]


def test_a_nan_score_reads_none_and_rows_keep_their_own_scores() -> None:
    layout = ProbeLayout(probes=(), columns={"a": 0, "b": 1}, version=1)
    processor = _processor()
    scores = np.array([[0.5, np.nan], [0.75, 0.125]], dtype=np.float32)
    step = StepResult(token_ids=[1, 2], probe_layout=layout, probe_scores=scores)
    names = ("b", "a")
    assert processor._probe_scores(_request(names), step, 0)[0] == [None, 0.5]
    assert processor._probe_scores(_request(names), step, 1)[0] == [0.125, 0.75]
