"""The data-parallel router: least_load picks the least loaded open engine, round_robin takes turns, prefix_affinity
keeps a prefix on its home engine until that engine is much more loaded; a full engine is never picked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer.frontend.dp_router import AFFINITY_FACTOR, AFFINITY_SLACK, EngineLoad, Router

loads_st = st.lists(st.builds(EngineLoad, st.integers(0, 100), st.booleans()), min_size=1, max_size=8)
prompt_st = st.lists(st.integers(0, 50_000), max_size=200)


@given(loads_st, prompt_st, st.sampled_from(["round_robin", "least_load", "prefix_affinity"]))
def test_a_full_engine_is_never_picked_and_none_only_when_all_are_full(loads, prompt, method):
    picked = Router(method, len(loads), 16).pick(prompt, loads)
    if all(load.full for load in loads):
        assert picked is None
    else:
        assert picked is not None and not loads[picked].full


@given(loads_st, prompt_st)
def test_least_load_picks_an_open_engine_with_the_fewest_live_requests(loads, prompt):
    picked = Router("least_load", len(loads), 16).pick(prompt, loads)
    if picked is not None:
        assert loads[picked].requests == min(load.requests for load in loads if not load.full)


def test_least_load_spreads_a_burst_as_each_submit_counts():
    router, waiting = Router("least_load", 3, 16), [0, 0, 0]
    for _ in range(9):
        i = router.pick([1, 2, 3], [EngineLoad(w, False) for w in waiting])
        waiting[i] += 1
    assert waiting == [3, 3, 3]


@given(st.integers(1, 6), st.integers(1, 30))
def test_round_robin_takes_turns_regardless_of_load(engines, requests):
    router = Router("round_robin", engines, 16)
    loads = [EngineLoad(100 * i, False) for i in range(engines)]
    assert [router.pick([], loads) for _ in range(requests)] == [i % engines for i in range(requests)]


def test_round_robin_skips_a_full_engine():
    router = Router("round_robin", 3, 16)
    loads = [EngineLoad(0, False), EngineLoad(0, True), EngineLoad(0, False)]
    assert [router.pick([], loads) for _ in range(3)] == [0, 2, 2]


@given(st.lists(st.integers(0, 50_000), min_size=16, max_size=300), st.integers(2, 8))
def test_prompts_sharing_the_hashed_prefix_share_a_home(prompt, engines):
    router = Router("prefix_affinity", engines, 16)
    head = prompt[: 16 * (len(prompt) // 16)][: 16 * 4]
    home = router.home(prompt)
    assert home is not None and 0 <= home < engines
    assert router.home(head + [7, 8, 9]) == home  # what follows the hashed blocks does not matter


def test_the_home_is_stable_across_routers_and_a_short_prompt_has_none():
    prompt = list(range(100, 200))
    assert Router("prefix_affinity", 4, 16).home(prompt) == Router("prefix_affinity", 4, 16).home(prompt)
    assert Router("prefix_affinity", 4, 16).home(list(range(15))) is None


@given(prompt_st, st.lists(st.integers(0, 40), min_size=2, max_size=6))
def test_prefix_affinity_keeps_the_home_until_it_is_much_more_loaded(prompt, totals):
    router = Router("prefix_affinity", len(totals), 16)
    loads = [EngineLoad(t, False) for t in totals]
    home, picked = router.home(prompt), router.pick(prompt, loads)
    if home is not None and totals[home] <= AFFINITY_FACTOR * min(totals) + AFFINITY_SLACK:
        assert picked == home
    else:
        assert totals[picked] == min(totals)


def test_prefix_affinity_leaves_a_full_home():
    prompt = list(range(64))
    router = Router("prefix_affinity", 2, 16)
    home = router.home(prompt)
    loads = [EngineLoad(0, i == home) for i in range(2)]
    assert router.pick(prompt, loads) == 1 - home


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="load_balance_method='random'"):
        Router("random", 2, 16)
    with pytest.raises(ValueError, match="data_parallel_size=0"):
        Router("least_load", 0, 16)
    with pytest.raises(ValueError, match="loads of 1 engines"):
        Router("least_load", 2, 16).pick([], [EngineLoad(0, False)])


def test_an_adapters_prompts_have_a_home_of_their_own():
    """The same prompt on different LoRA adapters hashes apart (their KV differs), on one adapter alike."""
    router = Router("prefix_affinity", 8, 16)
    prompt = list(range(64))
    homes = {router.home(prompt, name) for name in (None, "a", "b", "c", "d", "e")}
    assert len(homes) > 1
    assert router.home(prompt, "a") == router.home(prompt + [1, 2], "a")


def test_least_load_breaks_ties_from_the_routers_first_engine():
    """API server i starts its ties at engine i: two servers' odd requests of a burst land on different engines."""
    waiting = [0, 0]
    for first in (0, 1):
        router = Router("least_load", 2, 16, first=first)
        mine = [0, 0]
        for _ in range(3):
            i = router.pick([], [EngineLoad(w, False) for w in mine])
            mine[i] += 1
        waiting = [a + b for a, b in zip(waiting, mine)]
    assert waiting == [3, 3]


def test_round_robin_starts_its_turns_at_the_routers_first_engine():
    router = Router("round_robin", 3, 16, first=4)
    assert [router.pick([], [EngineLoad(0, False)] * 3) for _ in range(4)] == [1, 2, 0, 1]
