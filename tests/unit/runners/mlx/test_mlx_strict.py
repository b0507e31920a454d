"""Strict mode: inside a step's encode phase every evaluation or host conversion of an MLX array raises, naming the
phase and the call (mx.synchronize, repr, pickling, DLPack and torch conversions, numpy's frombuffer / copy, mx.save
included); `mx.async_eval` is allowed in the submit phase; all of them at the readback and between steps."""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
import threading

import mlx.core as mx
import numpy as np
import pytest
import torch

from infer.runners.mlx.strict import Phase, phase
from infer.runners.strict_sync import SyncInStepError

FORBIDDEN = {
    "mx.eval()": lambda a: mx.eval(a),
    "mx.async_eval()": lambda a: mx.async_eval(a),
    "array.item()": lambda a: a.item(),
    "array.tolist()": lambda a: a.tolist(),
    "array.__array__()": lambda a: a.__array__(),
    "array.__bool__()": lambda a: bool(a),
    "array.__int__()": lambda a: int(a),
    "array.__float__()": lambda a: float(a),
    "array.__index__()": lambda a: [0, 1][a],
    "np.array() of an MLX array": lambda a: np.array(a),
    "np.asarray() of an MLX array": lambda a: np.asarray(a),
    "memoryview() of an MLX array": lambda a: memoryview(a),
    "mx.synchronize()": lambda a: mx.synchronize(),
    "array.__repr__()": lambda a: repr(a),
    "array.__str__()": lambda a: str(a),
    "array.__format__()": lambda a: f"{a}",
    "array.__getstate__()": lambda a: pickle.dumps(a),
    "array.__dlpack__()": lambda a: a.__dlpack__(),
    "torch.from_dlpack() of an MLX array": lambda a: torch.from_dlpack(a),
    "torch.as_tensor() of an MLX array": lambda a: torch.as_tensor(a),
    "torch.tensor() of an MLX array": lambda a: torch.tensor(a),
    "np.frombuffer() of an MLX array": lambda a: np.frombuffer(a, dtype=np.int32),
    "np.copy() of an MLX array": lambda a: np.copy(a),
    "array.__iter__()": lambda a: list(a),
    "array.__deepcopy__()": lambda a: copy.deepcopy(a),
    "mx.save()": lambda a: mx.save(os.path.join(tempfile.mkdtemp(), "a.npy"), a),
    "mx.savez()": lambda a: mx.savez(os.path.join(tempfile.mkdtemp(), "a.npz"), a=a),
    "mx.save_safetensors()": lambda a: mx.save_safetensors(os.path.join(tempfile.mkdtemp(), "a.safetensors"), {"a": a}),
}
SCALAR = {"array.item()", "array.__bool__()", "array.__int__()", "array.__float__()", "array.__index__()"}


def _unevaluated(call: str) -> mx.array:
    """An array not evaluated yet (converting it would wait for the device): a scalar for the scalar conversions."""
    return mx.array(1, dtype=mx.int32) + 0 if call in SCALAR else mx.array([1, 2], dtype=mx.int32) + 0


@pytest.mark.parametrize("call", FORBIDDEN, ids=list(FORBIDDEN))
def test_each_forbidden_call_raises_inside_encode(call: str) -> None:
    a = _unevaluated(call)
    with phase(Phase.ENCODE), pytest.raises(SyncInStepError) as err:
        FORBIDDEN[call](a)
    assert call in str(err.value) and "encode phase" in str(err.value)
    FORBIDDEN[call](a)  # outside a step: allowed again (the guards are removed)


@pytest.mark.parametrize("call", [c for c in FORBIDDEN if c != "mx.async_eval()"])
def test_submit_allows_only_async_eval(call: str) -> None:
    a = _unevaluated(call)
    with phase(Phase.SUBMIT):
        mx.async_eval(a)
        with pytest.raises(SyncInStepError, match="submit phase"):
            FORBIDDEN[call](a)


@pytest.mark.parametrize("call", FORBIDDEN, ids=list(FORBIDDEN))
def test_readback_allows_everything(call: str) -> None:
    a = _unevaluated(call)
    with phase(Phase.READBACK):
        FORBIDDEN[call](a)


def test_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "0")
    with phase(Phase.ENCODE):
        assert (mx.array(2) + 1).item() == 3


def test_host_values_that_are_not_mlx_arrays_pass() -> None:
    with phase(Phase.ENCODE):
        assert np.array([1, 2]).sum() == 3 and memoryview(b"ab")[0] == 97


def test_other_threads_are_not_guarded() -> None:
    """The phase is per thread: another thread (a grammar worker, the API loop) converts freely meanwhile."""
    seen: list[float] = []
    with phase(Phase.ENCODE):
        worker = threading.Thread(target=lambda: seen.append(float(mx.array(1.5) + 1)))
        worker.start()
        worker.join()
    assert seen == [2.5]
