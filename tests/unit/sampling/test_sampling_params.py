"""SamplingParams: defaults, normalisation, and validation errors that name the offending field."""

from __future__ import annotations

import math

import pytest

from infer.sampling.params import SamplingParams


def test_defaults() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (1.0, 1.0, None, 1.0)
    assert (p.max_tokens, p.stop, p.seed, p.ignore_eos) == (128, [], None, False)
    assert not p.greedy


def test_stop_lists_are_not_shared_between_instances() -> None:
    a, b = SamplingParams(), SamplingParams()
    a.stop.append("x")
    assert b.stop == []


@pytest.mark.parametrize("temperature, greedy", [(0, True), (0.0, True), (1e-6, True), (1e-4, False), (2, False)])
def test_greedy_is_temperature_zero_or_vanishing(temperature: float, greedy: bool) -> None:
    p = SamplingParams(temperature=temperature)
    assert p.greedy is greedy
    assert isinstance(p.temperature, float)


@pytest.mark.parametrize("top_k, expected", [(None, None), (0, None), (-1, None), (1, 1), (50, 50)])
def test_top_k_disabled_values_normalise_to_none(top_k: int | None, expected: int | None) -> None:
    assert SamplingParams(top_k=top_k).top_k == expected


@pytest.mark.parametrize(
    "stop, expected",
    [
        ("</s>", ["</s>"]),
        ("", []),
        (None, []),
        (["a", "", "bc"], ["a", "bc"]),
        (("x", "y"), ["x", "y"]),
    ],
)
def test_stop_normalises_to_list_without_empty_strings(stop: object, expected: list[str]) -> None:
    assert SamplingParams(stop=stop).stop == expected  # type: ignore[arg-type]


def test_boundary_values_are_accepted() -> None:
    p = SamplingParams(temperature=0, top_p=1.0, top_k=1, repetition_penalty=1e-3, max_tokens=1, seed=2**63 - 1)
    assert p.seed == 2**63 - 1
    assert SamplingParams(seed=0).seed == 0
    assert SamplingParams(top_p=1e-9).top_p == 1e-9


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "hot"),
        ("top_p", 0.0),
        ("top_p", -0.5),
        ("top_p", 1.0001),
        ("top_p", math.nan),
        ("top_k", -2),
        ("top_k", 2.5),
        ("top_k", True),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", math.nan),
        ("repetition_penalty", math.inf),
        ("max_tokens", -1),
            ("logprobs", 21),
            ("logprobs", -1),
            ("prompt_logprobs", 1.0),
        ("max_tokens", -5),
        ("max_tokens", 1.5),
        ("stop", 5),
        ("stop", ["ok", 3]),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 1.5),
        ("seed", True),
    ],
)
def test_invalid_values_raise_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
