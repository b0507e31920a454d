"""The probe read-out and bank: kernel against a float64 reference, taps, in-place reload, capacity rules."""

from __future__ import annotations

import importlib
import os
import random
import sys

import pytest
import torch

from omniscience import ProbeBank, ProbeError, load_probe_set
from omniscience.kernel import ACTIVATION_CODES, reference_scores
from probe_sets import Spec, expected_scores, float64_scores, write_probe_set

HIDDEN, LAYERS = 16, 4


@pytest.fixture()
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))


def _inputs(rng, rows, hidden, probes):
    h = torch.randn(rows, hidden, generator=rng)
    weight = torch.randn(hidden, probes, generator=rng) * 0.2
    bias = torch.randn(probes, generator=rng)
    codes = torch.randint(0, 3, (probes,), generator=rng, dtype=torch.int32)
    return h, weight, bias, codes


@pytest.mark.parametrize("rows, hidden, probes", [(1, 64, 16), (5, 96, 16), (70, 64, 48), (17, 200, 80)])
def test_reference_matches_float64(rng, rows, hidden, probes):
    h, weight, bias, codes = _inputs(rng, rows, hidden, probes)
    got = reference_scores(h, weight, bias, codes)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), float64_scores(h, weight, bias, codes), rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"{m} (seed {rng.initial_seed()})")


@pytest.fixture(scope="module")
def interpreted_kernel():
    """omniscience.kernel imported afresh with TRITON_INTERPRET=1 (its Triton kernel runs on the CPU)."""
    pytest.importorskip("triton")
    saved = sys.modules.pop("omniscience.kernel")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield importlib.import_module("omniscience.kernel")
    finally:
        del os.environ["TRITON_INTERPRET"]
        sys.modules["omniscience.kernel"] = saved
        import omniscience

        omniscience.kernel = saved  # the package attribute too: later imports see the compiled module


@pytest.mark.parametrize("rows, hidden, probes", [(1, 64, 16), (3, 96, 16), (20, 64, 48), (70, 130, 80)])
def test_triton_kernel_matches_float64_into_a_column_slice(interpreted_kernel, rng, rows, hidden, probes):
    h, weight, bias, codes = _inputs(rng, rows, hidden, probes)
    out = torch.full((rows + 3, probes + 32), 7.0)
    interpreted_kernel.launch_kernel(h, weight, bias, codes, out[:rows, 16 : 16 + probes])
    torch.testing.assert_close(out[:rows, 16 : 16 + probes].double(), float64_scores(h, weight, bias, codes),
                               rtol=1e-5, atol=1e-5, msg=lambda m: f"{m} (seed {rng.initial_seed()})")
    untouched = torch.ones_like(out, dtype=torch.bool)
    untouched[:rows, 16 : 16 + probes] = False
    assert (out[untouched] == 7.0).all()  # nothing outside the slice is written


def _bank(tmp_path, specs, seed=0, rows=32):
    path = write_probe_set(tmp_path, HIDDEN, specs, seed=seed)
    return path, ProbeBank(load_probe_set(path, HIDDEN, LAYERS), HIDDEN, rows, torch.device("cpu"))


def test_taps_pass_the_residual_through_and_write_each_layers_columns(tmp_path, rng):
    path, bank = _bank(tmp_path, [Spec("a", 1, "sigmoid"), Spec("b", 3, "tanh", count=3), Spec("c", 1)])
    probe_set = load_probe_set(path, HIDDEN, LAYERS)
    taps = bank.taps()
    assert sorted(taps) == [1, 3] and bank.scores.shape == (32, 32)  # two layers, 16 columns each
    residuals = {layer: torch.randn(5, HIDDEN, generator=rng) for layer in taps}
    for layer, tap in taps.items():
        assert tap(residuals[layer]) is residuals[layer]
    for probe in probe_set.probes:
        got = bank.scores[:5, bank.layout.columns[probe.name]].double().numpy()
        assert abs(got - expected_scores(probe, residuals[probe.layer])).max() < 1e-5


def test_reload_rewrites_the_same_buffers_and_zeroes_unused_columns(tmp_path, rng):
    _, bank = _bank(tmp_path, [Spec("a", 1), Spec("b", 1, count=3)])
    pointers = [t.data_ptr() for t in (*bank.weights.values(), *bank.biases.values(), *bank.codes.values(), bank.scores)]
    smaller = write_probe_set(tmp_path / "v2", HIDDEN, [Spec("a", 1, "tanh")], seed=5)
    layout = bank.load(load_probe_set(smaller, HIDDEN, LAYERS))
    assert layout.version == 2 and layout.names == ("a",)
    assert [t.data_ptr() for t in (*bank.weights.values(), *bank.biases.values(), *bank.codes.values(), bank.scores)] == pointers
    assert (bank.weights[1][:, 1:] == 0).all() and (bank.biases[1][1:] == 0).all()
    assert bank.codes[1][0] == ACTIVATION_CODES["tanh"]
    h = torch.randn(2, HIDDEN, generator=rng)
    bank.taps()[1](h)
    new = load_probe_set(smaller, HIDDEN, LAYERS).probes[0]
    assert abs(bank.scores[:2, 0].double().numpy() - expected_scores(new, h)).max() < 1e-5


def test_reload_cannot_add_a_layer_or_overflow_a_layers_capacity(tmp_path):
    _, bank = _bank(tmp_path, [Spec("a", 1)])
    before = bank.weights[1].clone()
    for specs, message in (([Spec("a", 2)], "layer 2 is not probed"), ([Spec("a", 1, count=17)], "room for 16")):
        bigger = write_probe_set(tmp_path / message[:7], HIDDEN, specs, seed=3)
        with pytest.raises(ProbeError, match=message):
            bank.load(load_probe_set(bigger, HIDDEN, LAYERS))
    assert torch.equal(bank.weights[1], before) and bank.layout.version == 1  # nothing was written


@pytest.mark.parametrize("rows, hidden, probes", [(1, 576, 16), (5, 300, 16), (64, 256, 48)])
def test_split_kernel_matches_float64_and_leaves_its_workspace_zero(interpreted_kernel, rng, rows, hidden, probes):
    partial, tickets = interpreted_kernel.workspace(probes + 16, torch.device("cpu"))
    for _ in range(2):  # a second call sees the workspace the first left behind
        h, weight, bias, codes = _inputs(rng, rows, hidden, probes)
        out = torch.full((rows, probes + 16), 7.0)
        interpreted_kernel.launch_split_kernel(h, weight, bias, codes, out[:, 8 : 8 + probes], partial, tickets)
        torch.testing.assert_close(out[:, 8 : 8 + probes].double(), float64_scores(h, weight, bias, codes),
                                   rtol=1e-5, atol=1e-5, msg=lambda m: f"{m} (seed {rng.initial_seed()})")
        assert (partial == 0).all() and (tickets == 0).all()
