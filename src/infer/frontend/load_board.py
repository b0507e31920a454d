"""LoadBoard: every API server's live requests on each data-parallel engine, in memory the API servers share.

Each API server writes only its own row (its requests submitted to engine e and not yet finished) and the router
reads the column sums: the requests on each engine across all API servers, current at the moment of routing. An
engine's own report (waiting + running) lags by a step, and it counts only requests the core has taken in: a core
inside a long prefill step reads none of its socket, so the API servers saw it as the emptier one and a burst
from several API servers piled onto it. With identical requests filling every engine's batch exactly, the
engine given a few extra ran them as a last wave of decode steps at a tiny batch (docs/distributed.md, "Routing").

One writer per row and aligned 8-byte stores: readers may see a row a request old, never a torn value. The board
lives in a `multiprocessing.RawArray` made by the launcher before it spawns the API servers (a restarted API
server zeroes its row: its predecessor's requests died with it); one API server alone keeps a private board.
"""

from __future__ import annotations

import multiprocessing
from array import array
from typing import Any


class LoadBoard:
    """Live requests per (API server, engine); this process writes row `row`."""

    def __init__(self, cells: Any, rows: int, engines: int, row: int) -> None:
        if not 0 <= row < rows:
            raise ValueError(f"row={row}: must be in [0, {rows})")
        self._cells = memoryview(cells).cast("B").cast("q")
        if len(self._cells) != rows * engines:
            raise ValueError(f"a board of {len(self._cells)} cells is not {rows} rows x {engines} engines")
        self.rows, self.engines, self.row = rows, engines, row
        self._mine = row * engines
        for engine in range(engines):
            self._cells[self._mine + engine] = 0

    @staticmethod
    def shared(rows: int, engines: int) -> Any:
        """Zeroed cells for `rows` API server processes (pass them to each, then `LoadBoard(cells, ..., row=i)`)."""
        return multiprocessing.get_context("spawn").RawArray("q", rows * engines)

    @classmethod
    def private(cls, engines: int) -> LoadBoard:
        """The board of a lone API server."""
        return cls(array("q", bytes(8 * engines)), 1, engines, 0)

    def set(self, engine: int, live: int) -> None:
        """This API server now has `live` requests on `engine`."""
        self._cells[self._mine + engine] = live

    def totals(self) -> list[int]:
        """Live requests on each engine, summed over every API server's row."""
        cells, engines = self._cells, self.engines
        return [sum(cells[engine::engines]) for engine in range(engines)]
