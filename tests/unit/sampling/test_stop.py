"""StopChecker: hit positions, which of several stops wins, holdback, and streaming == one-shot; the bounds on a
request's stop strings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.sampling.params import SamplingParams
from infer.sampling.stop import StopChecker
from infer.sampling.params import MAX_STOP_CHARS, MAX_STOP_STRINGS


def test_hit_index_is_where_the_stop_starts() -> None:
    checker = StopChecker(["</s>"])
    assert checker.check("hello</s>world") == 5
    assert checker.check("</s>") == 0
    assert checker.check("hello </") is None
    assert checker.check("") is None


def test_earliest_of_several_stops_wins_regardless_of_list_order() -> None:
    assert StopChecker(["baz", "bar"]).check("foo bar baz") == 4
    assert StopChecker(["bar", "baz"]).check("foo baz bar") == 4
    assert StopChecker(["xyz", "o"]).check("foo xyz") == 1


def test_match_spans_the_stop_that_completes_first() -> None:
    assert StopChecker(["b", "ab"]).match("xab") == (1, 3)
    assert StopChecker(["abcd", "bc"]).match("abcd") == (1, 3)
    assert StopChecker(["</s>"]).match("hello </") is None


def test_repeated_stop_reports_its_first_occurrence() -> None:
    assert StopChecker(["ab"]).check("xxabxxab") == 2


def test_stops_ending_together_prefer_the_longer_one() -> None:
    assert StopChecker(["b", "ab"]).check("xab") == 1


def test_stop_inside_a_longer_stop_wins_because_it_completes_first() -> None:
    # A stream sees "bc" complete before "abcd" can, so generation ends there.
    assert StopChecker(["abcd", "bc"]).check("abcd") == 1


def test_holdback_is_the_longest_partial_stop_suffix() -> None:
    checker = StopChecker(["<|end|>", "STOP"])
    assert checker.holdback("Hello <|e") == 3
    assert checker.holdback("Hello <|end|") == 6
    assert checker.holdback("Hello ST") == 2
    assert checker.holdback("Hello") == 0
    assert checker.holdback("") == 0
    assert checker.holdback("<") == 1


def test_holdback_counts_only_proper_prefixes() -> None:
    assert StopChecker(["ab"]).holdback("xab") == 0
    assert StopChecker(["aa"]).holdback("xaa") == 1
    assert StopChecker(["aaa"]).holdback("aaaa") == 2


def test_stop_lists_are_bounded_in_count_and_length() -> None:
    """Each stop string is matched against every token's text: a request may not send an unbounded amount."""
    assert SamplingParams(stop=["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS).stop[0] == "x" * MAX_STOP_CHARS
    with pytest.raises(ValueError, match=f"stop takes at most {MAX_STOP_STRINGS} strings"):
        SamplingParams(stop=["a"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match=f"stop strings are at most {MAX_STOP_CHARS} characters"):
        SamplingParams(stop="y" * (MAX_STOP_CHARS + 1))
    with pytest.raises(ValueError, match="stop must be a string") as caught:
        SamplingParams(stop=[1] * 10_000)
    assert len(str(caught.value)) < 300  # the message quotes the start of what it refuses, not all of it


def test_no_stops_means_no_hits_and_no_holdback() -> None:
    for checker in (StopChecker([]), StopChecker([""])):
        assert checker.check("anything") is None
        assert checker.holdback("anything") == 0


def _reference_holdback(stops: list[str], text: str) -> int:
    """Brute force: longest suffix of text equal to a proper prefix of some stop."""
    return max(
        (n for s in stops for n in range(1, len(s)) if n <= len(text) and text.endswith(s[:n])),
        default=0,
    )


def _one_shot(checker: StopChecker, text: str) -> str:
    """The final output for a whole text: truncated before the hit, or all of it."""
    hit = checker.check(text)
    return text if hit is None else text[:hit]


def _stream(checker: StopChecker, text: str, cuts: list[int]) -> str:
    """Feed text in chunks ending at `cuts`, streaming only what holdback allows; return all streamed text."""
    emitted = ""
    for end in [*sorted(set(cuts)), len(text)]:
        seen = text[:end]
        hit = checker.check(seen)
        if hit is not None:
            final = seen[:hit]
            assert final.startswith(emitted), "streamed text was later cut away"
            return final
        safe = seen[: len(seen) - checker.holdback(seen)]
        assert safe.startswith(emitted)
        emitted = safe
    return text  # finished without a stop: flush the held-back tail


_stops = st.lists(st.text(alphabet="ab c", min_size=1, max_size=8), max_size=3)
_texts = st.text(alphabet="ab c", max_size=40)


@settings(max_examples=400, deadline=None)
@given(stops=_stops, text=_texts)
def test_char_by_char_streaming_equals_one_shot(stops: list[str], text: str) -> None:
    checker = StopChecker(stops)
    assert _stream(checker, text, list(range(1, len(text)))) == _one_shot(checker, text)


@settings(max_examples=400, deadline=None)
@given(stops=_stops, text=_texts, data=st.data())
def test_any_chunking_equals_one_shot(stops: list[str], text: str, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text))))
    checker = StopChecker(stops)
    assert _stream(checker, text, cuts) == _one_shot(checker, text)


@settings(max_examples=400, deadline=None)
@given(stops=_stops, text=_texts)
def test_holdback_matches_brute_force(stops: list[str], text: str) -> None:
    assert StopChecker(stops).holdback(text) == _reference_holdback(stops, text)


@settings(max_examples=400, deadline=None)
@given(stops=_stops, text=_texts)
def test_result_contains_no_stop_string(stops: list[str], text: str) -> None:
    out = _one_shot(StopChecker(stops), text)
    assert not any(s in out for s in stops)
