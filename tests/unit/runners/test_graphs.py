"""runners/graphs.py: which short-context bounds get a decode graph set under a capacity."""

from __future__ import annotations

from infer.runners.graphs import SHORT_CONTEXTS, short_bounds


def test_a_bound_gets_graphs_only_where_it_at_least_halves_the_capacity():
    assert SHORT_CONTEXTS == tuple(sorted(SHORT_CONTEXTS))  # the runner replays the first bound a context fits
    assert short_bounds(511) == ()
    assert short_bounds(512) == (256,)
    assert short_bounds(1152) == (256,)  # moe_decode.py's headline capacity
    assert short_bounds(4096) == (256, 2048)
    assert short_bounds(40960) == SHORT_CONTEXTS
