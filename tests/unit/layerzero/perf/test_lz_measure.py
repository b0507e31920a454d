"""Measurement protocol: warmup calls are untimed, each timed call is one sample in µs; device signatures."""

from __future__ import annotations

import os
import statistics
import time

import pytest
import torch

from layerzero.perf.measure import device_signature, measure


def test_cpu_measure_counts_and_times_calls() -> None:
    calls = []

    def fn() -> None:
        calls.append(None)
        time.sleep(0.002 if len(calls) > 2 else 0.0)

    samples = measure(fn, device="cpu", warmup=2, iters=5)
    assert len(calls) == 7 and len(samples) == 5
    assert all(2000.0 <= s < 200_000.0 for s in samples)  # µs: slept 2 ms in every timed call


def test_measure_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        measure(lambda: None, device="cpu", iters=0)
    with pytest.raises(ValueError):
        measure(lambda: None, device="cpu", warmup=-1)


def test_cpu_signature_names_model_threads_and_torch() -> None:
    sig = device_signature("cpu")
    assert sig.startswith("cpu|") and f"torch{torch.__version__}" in sig
    assert f"threads{torch.get_num_threads()}" in sig
    assert device_signature(torch.device("cpu")) == sig


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("flush_l2", [False, True])
def test_cuda_measure_uses_events(flush_l2: bool) -> None:
    a = torch.randn(2048, 2048, device="cuda")
    small = measure(lambda: a[:64, :64] @ a[:64, :64], device="cuda", iters=9, flush_l2=flush_l2)
    big = measure(lambda: a @ a, device="cuda", iters=9, flush_l2=flush_l2)
    assert len(small) == len(big) == 9 and all(s > 0 for s in small + big)
    assert statistics.median(big) > 2 * statistics.median(small)  # 2048^3 vs 64^3 (clocks may still be ramping)
    sig = device_signature("cuda")
    props = torch.cuda.get_device_properties(0)
    assert sig.startswith(f"cuda|{props.name}|sm{props.major}{props.minor}|") and device_signature("cuda:0") == sig
    if os.path.exists("/proc/driver/nvidia/version"):
        assert "|driverunknown|" not in sig
