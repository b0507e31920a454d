"""EngineConfig.runner: validated at construction; "auto" is torch off Apple silicon; the MLX builder declines what
the MLX runner does not run, at startup, naming the field."""

from __future__ import annotations

import sys

import pytest

from infer.engine.config import EngineConfig, EngineConfigError
from infer.build.mlx_builder import check_mlx_config
from probe_sets import Spec, write_probe_set


def test_runner_must_be_known() -> None:
    with pytest.raises(EngineConfigError, match="^runner='metal': must be one of auto, torch, mlx"):
        EngineConfig(runner="metal")


@pytest.mark.skipif(sys.platform == "darwin", reason="auto picks mlx on Apple silicon")
def test_auto_is_torch_off_apple_silicon() -> None:
    assert EngineConfig().resolved_runner == "torch"
    assert EngineConfig(runner="mlx").resolved_runner == "mlx"


def test_auto_keeps_an_explicit_device_on_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import infer.runners.mlx as package

    monkeypatch.setattr(package, "apple_metal", lambda: True)
    assert EngineConfig().resolved_runner == "mlx"
    assert EngineConfig(device="cpu").resolved_runner == "torch"


def test_probes_are_declined(tmp_path) -> None:
    probes = write_probe_set(tmp_path, 64, [Spec("p", 0)])
    with pytest.raises(EngineConfigError, match="^probes=.*torch-only"):
        check_mlx_config(EngineConfig(runner="mlx", probes=str(probes)))


@pytest.mark.parametrize("option", [dict(speculative_method="ngram"), dict(quantization="fp8"),
                                    dict(tensor_parallel_size=2)], ids=lambda o: next(iter(o)))
def test_other_declines_name_their_field(option: dict) -> None:
    field = next(iter(option))
    with pytest.raises(EngineConfigError, match=f"^{field}="):
        check_mlx_config(EngineConfig(runner="mlx", **option))
