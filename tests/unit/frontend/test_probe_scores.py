"""ProbeScores reads a token's probe scores from the core's row as a mapping; probe_columns transposes a request's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from infer.frontend.outputs import ProbeScores, probe_columns

NAMES = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8, unique=True)
SCORE = st.one_of(st.none(), st.floats(allow_nan=False, width=32))


@given(NAMES, st.data())
def test_probe_scores_is_the_dict_of_names_to_row(names: list[str], data: st.DataObject) -> None:
    row = data.draw(st.lists(SCORE, min_size=len(names), max_size=len(names)))
    scores = ProbeScores({name: i for i, name in enumerate(names)}, row)
    want = dict(zip(names, row))
    assert scores == want and dict(scores) == want and list(scores) == names
    assert all(scores[name] == value for name, value in want.items()) and scores.get("not asked") is None


@given(NAMES, st.data())
def test_probe_columns_gives_a_list_per_name_in_token_order(names: list[str], data: st.DataObject) -> None:
    index = {name: i for i, name in enumerate(names)}
    rows = data.draw(st.lists(st.lists(SCORE, min_size=len(names), max_size=len(names)), max_size=6))
    columns = probe_columns([ProbeScores(index, row) for row in rows])
    assert columns == ({name: [row[i] for row in rows] for i, name in enumerate(names)} if rows else {})
