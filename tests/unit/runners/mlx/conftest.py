"""The MLX runner's tests: skipped without the mlx extra, and every one runs with strict mode on (INFER_STRICT_SYNC=1),
so any wait or host conversion inside a step's encode phase fails the test that caused it."""

from __future__ import annotations

import pytest

pytest.importorskip("mlx.core")


@pytest.fixture(autouse=True)
def _strict_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
