"""One counter bumped by every change that can alter a selection outside the call itself.

Registry edits, device-capability refreshes, circuit-breaker transitions and `SelectionEngine.invalidate`
bump it; a bound call site (`layerzero.dispatch.bound`) compares it on every call and re-binds when it
moved. Policy changes are not counted here: a bound site compares the policy object itself.
"""

from __future__ import annotations


class Generation:
    """A monotonically increasing integer, read without a lock (an int read is atomic)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


GENERATION = Generation()
