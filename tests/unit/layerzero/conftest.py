"""Fixtures for the Triton kernel tests: interpreted kernel modules, fresh random inputs, spec tolerances.

`@triton.jit` picks the interpreter when the kernel is decorated, so each module is imported afresh
with TRITON_INTERPRET=1 set for that import only. The environment, sys.modules and the package
attribute are restored afterwards: other tests in the session (and CUDA tests) keep compiled kernels
and the default kernel selection.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

PACKAGE = "layerzero.kernels.triton"


def load_interpreted(name: str) -> ModuleType:
    """A private copy of layerzero.kernels.triton.<name> whose kernels run through the interpreter."""
    full = f"{PACKAGE}.{name}"
    importlib.import_module("triton")  # triton itself stays compiled-mode: only our kernels are interpreted
    package = importlib.import_module(PACKAGE)
    saved_module = sys.modules.pop(full, None)
    saved_attr = getattr(package, name, None)
    saved_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module(full)
    finally:
        if saved_env is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
        if saved_module is None:
            sys.modules.pop(full, None)
        else:
            sys.modules[full] = saved_module
        if saved_attr is None:
            package.__dict__.pop(name, None)
        else:
            setattr(package, name, saved_attr)


@pytest.fixture(scope="session")
def triton_interpreted() -> Callable[[str], ModuleType]:
    """Loader of interpreted Triton kernel modules (skips when triton is not installed)."""
    pytest.importorskip("triton")
    return load_interpreted


# the per-dtype tolerances (rtol = atol) against the PyTorch reference, as tools/inspect.py TOLERANCES
SPEC_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.fixture
def rng() -> torch.Generator:
    """A generator with a fresh random seed; `assert_matches` reports the seed when a check fails."""
    return torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))


@pytest.fixture
def assert_matches(rng: torch.Generator) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """assert_close with the spec tolerance of the expected tensor's dtype, naming the seed on failure."""

    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        tol = SPEC_TOLERANCE[expected.dtype]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=tol, atol=tol,
                                   msg=lambda m: f"{m}\n(inputs from seed {rng.initial_seed()})")

    return check
