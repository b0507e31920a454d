"""Prompt lookup: what it proposes is what followed the most recent earlier occurrence of the longest matching
suffix (checked against a brute-force search on random sequences), within the limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.speculative import NgramProposer


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent first, ending before the last token
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=0, max_size=40), k=st.integers(1, 6),
       min_n=st.integers(1, 3), extra=st.integers(0, 3), limit=st.integers(0, 8))
def test_proposals_match_a_brute_force_lookup(tokens: list[int], k: int, min_n: int, extra: int, limit: int) -> None:
    proposer = NgramProposer(k, min_n, min_n + extra)
    want = brute_force(tokens, min(k, limit), min_n, min_n + extra) if len(tokens) > min_n and limit > 0 else []
    assert proposer.propose(tokens, limit) == want


def test_longest_suffix_wins_over_a_more_recent_shorter_one() -> None:
    tokens = [1, 2, 3, 7, 8, 9, 3, 5, 5, 1, 2, 3]
    assert NgramProposer(2, 1, 3).propose(tokens, 10) == [7, 8]  # "1 2 3" matched at the start, not "3" later
    assert NgramProposer(2, 1, 1).propose(tokens, 10) == [5, 5]  # only one-token suffixes: the latest "3"


def test_no_match_proposes_nothing() -> None:
    assert NgramProposer(4, 1, 4).propose([1, 2, 3, 4], 10) == []
    assert NgramProposer(4, 2, 4).propose([1, 2, 9, 2], 10) == []  # "2" recurs, but no two-token suffix does


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="min"):
        NgramProposer(4, 3, 2)
