"""The load board: each API server writes its row, every one reads the column sums; a row starts at zero (a
restarted API server's predecessor's requests are gone); the cells reach a spawned process."""

from __future__ import annotations

import multiprocessing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer.frontend.load_board import LoadBoard


@given(st.integers(1, 6), st.integers(1, 5), st.data())
def test_totals_are_the_column_sums_of_every_row(rows, engines, data):
    cells = LoadBoard.shared(rows, engines)
    boards = [LoadBoard(cells, rows, engines, row) for row in range(rows)]
    grid = data.draw(st.lists(st.lists(st.integers(0, 10_000), min_size=engines, max_size=engines),
                              min_size=rows, max_size=rows))
    for board, counts in zip(boards, grid):
        for engine, live in enumerate(counts):
            board.set(engine, live)
    expected = [sum(counts[e] for counts in grid) for e in range(engines)]
    assert all(board.totals() == expected for board in boards)


def test_a_new_board_on_a_row_zeroes_only_that_row():
    cells = LoadBoard.shared(2, 2)
    first, other = LoadBoard(cells, 2, 2, 0), LoadBoard(cells, 2, 2, 1)
    first.set(0, 7)
    other.set(1, 3)
    LoadBoard(cells, 2, 2, 0)  # API server 0 started again
    assert other.totals() == [0, 3]


def test_a_private_board_and_bad_shapes():
    board = LoadBoard.private(3)
    board.set(2, 4)
    assert board.totals() == [0, 0, 4]
    with pytest.raises(ValueError, match="row=2"):
        LoadBoard(LoadBoard.shared(2, 2), 2, 2, 2)
    with pytest.raises(ValueError, match="not 3 rows x 2 engines"):
        LoadBoard(LoadBoard.shared(2, 2), 3, 2, 0)


def _write_row(cells, rows: int, engines: int, row: int) -> None:
    LoadBoard(cells, rows, engines, row).set(1, 5)


def test_the_cells_reach_a_spawned_api_server_process():
    cells = LoadBoard.shared(2, 2)
    mine = LoadBoard(cells, 2, 2, 0)
    mine.set(0, 2)
    child = multiprocessing.get_context("spawn").Process(target=_write_row, args=(cells, 2, 2, 1))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and mine.totals() == [2, 5]
