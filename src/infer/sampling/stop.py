"""Stop-string matching for streamed text: where to truncate, and how much tail to hold back meanwhile."""

from __future__ import annotations


class StopChecker:
    """Finds the first stop string to complete in a text and the tail that might still become one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]

    def check(self, text: str, checked: int = 0) -> int | None:
        """Start index of the stop string that completes first in `text` (None if none occurs); see `match`."""
        found = self.match(text, checked)
        return None if found is None else found[0]

    def match(self, text: str, checked: int = 0) -> tuple[int, int] | None:
        """(start, end) of the stop string that completes first in `text` (None if none occurs).

        "First" means the smallest end position, ties going to the longer match: that is the stop a
        left-to-right stream meets first, so the result does not depend on how the text was chunked.
        It equals the earliest start unless one occurrence lies strictly inside a longer one.
        `text[:checked]` is known to hold no stop string: only matches ending after it are looked for.
        """
        best: tuple[int, int] | None = None  # (end, start)
        for stop in self.stops:
            start = text.find(stop, max(0, checked - len(stop) + 1))
            if start >= 0 and (best is None or (start + len(stop), start) < best):
                best = (start + len(stop), start)
        return None if best is None else (best[1], best[0])

    def holdback(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string. Only the suffixes
        starting with a stop's first character are tried, longest first; nothing is kept per prefix, so memory is
        the stops' own length."""
        best = 0
        for stop in self.stops:
            tail = text[max(0, len(text) - len(stop) + 1) :]
            at = tail.find(stop[0])
            while 0 <= at and len(tail) - at > best:
                if stop.startswith(tail[at:]):
                    best = len(tail) - at
                    break
                at = tail.find(stop[0], at + 1)
        return best
