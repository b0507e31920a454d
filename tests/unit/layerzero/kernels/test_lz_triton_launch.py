"""The Triton launcher's programmatic-dependent-launch plumbing: which kernels get PDL, and where it is off."""

from __future__ import annotations

import torch

from layerzero.kernels.triton import launch


class _Kernel:
    """Stands in for a jitted kernel: records the keywords of each launch."""

    def __init__(self, names: list[str]) -> None:
        self.arg_names = names
        self.calls: list[dict] = []

    def __getitem__(self, grid):
        def run(*args, **keywords):
            self.calls.append(keywords)

        return run


def test_pdl_is_off_on_the_cpu_and_under_the_interpreter(monkeypatch):
    assert launch.pdl_launch(torch.device("cpu")) is False
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    assert launch.pdl_launch(torch.device("cuda", 0)) is False


def test_an_interpreted_pdl_kernel_gets_pdl_false_and_no_launch_option(monkeypatch):
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    pdl_kernel, plain_kernel = _Kernel(["x_ptr", "BLOCK", "PDL"]), _Kernel(["x_ptr", "BLOCK"])
    launch.Launcher(pdl_kernel)((1,), torch.zeros(2), BLOCK=2)
    launch.Launcher(plain_kernel)((1,), torch.zeros(2), BLOCK=2)
    assert pdl_kernel.calls == [{"PDL": False, "BLOCK": 2}]
    assert plain_kernel.calls == [{"BLOCK": 2}]


def test_every_layerzero_triton_kernel_takes_pdl():
    """The invariant of the module docstring holds only if every launched kernel waits: each has the constexpr."""
    import importlib

    names = ["activation", "argmax", "gemv", "kv_cache", "linear_int4", "linear_w8", "norm", "paged_attention",
             "rope", "rope_kv", "varlen_attention"]
    launchers = [value for name in names
                 for value in vars(importlib.import_module(f"layerzero.kernels.triton.{name}")).values()
                 if isinstance(value, launch.Launcher)]
    assert len(launchers) >= 15
    assert all(launcher.pdl for launcher in launchers)


def test_pdl_needs_a_cuda_runtime_whose_graphs_capture_it(monkeypatch):
    for version, ok in (("12.1", False), ("12.4", True), ("13.0", True), (None, False)):
        monkeypatch.setattr(torch.version, "cuda", version)
        assert (launch._cuda_runtime() >= launch.PDL_MIN_CUDA) is ok
