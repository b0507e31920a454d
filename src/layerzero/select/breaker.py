"""Circuit breaker (docs/layerzero.md, "Fallback and circuit breaker"): a backend that fails N times in a row is disabled for a cool-down.

While open, selection rejects the backend's kernels with CIRCUIT_OPEN. After the cool-down the backend
is selectable again (half-open): one success closes the circuit, one more failure re-opens it. Every change
of state moves GENERATION, so selection caches drop choices made under the old state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from layerzero.select.generation import GENERATION
from layerzero.select.reasons import CIRCUIT_OPEN, Reason

DEFAULT_THRESHOLD = 3
DEFAULT_COOLDOWN_S = 30.0


@dataclass
class _State:
    failures: int = 0
    open_until: float | None = None
    last_error: str = ""


class CircuitBreaker:
    """Per-backend consecutive-failure counter with timed disabling."""

    def __init__(self, threshold: int = DEFAULT_THRESHOLD, cooldown_s: float = DEFAULT_COOLDOWN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1 or cooldown_s < 0:
            raise ValueError(f"need threshold >= 1 and cooldown_s >= 0, got {threshold}, {cooldown_s}")
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._next_expiry: float | None = None

    def tick(self) -> None:
        """End the cool-downs that have expired (which moves GENERATION); cheap when none is pending."""
        expiry = self._next_expiry
        if expiry is not None and self._clock() >= expiry:
            with self._lock:
                self._expire()

    def _expire(self) -> None:
        now = self._clock()
        pending = [s.open_until for s in self._states.values() if s.open_until is not None]
        expired = [t for t in pending if t <= now]
        if expired:
            GENERATION.bump()
        future = [t for t in pending if t > now]
        self._next_expiry = min(future) if future else None

    def reason(self, backend: str) -> Reason | None:
        """CIRCUIT_OPEN while the backend is in its cool-down, else None."""
        state = self._states.get(backend)
        if state is None or state.open_until is None or self._clock() >= state.open_until:
            return None
        left = state.open_until - self._clock()
        return Reason(CIRCUIT_OPEN, f"backend {backend} disabled for {left:.0f}s more after {state.failures} "
                                    f"consecutive failures (last: {state.last_error})")

    def record_failure(self, backend: str, error: BaseException) -> bool:
        """Count a runtime failure; returns True when this failure opened the circuit."""
        with self._lock:
            state = self._states.setdefault(backend, _State())
            state.failures += 1
            GENERATION.bump()
            state.last_error = f"{type(error).__name__}: {error}"[:200]
            if state.failures >= self.threshold:
                state.open_until = self._clock() + self.cooldown_s
                self._next_expiry = min(state.open_until, self._next_expiry or state.open_until)
                return True
            return False

    @property
    def active(self) -> bool:
        """Whether any backend has recorded failures (dispatch only reports successes then)."""
        return bool(self._states)

    def record_success(self, backend: str) -> None:
        """A successful run closes the backend's circuit and resets its count."""
        with self._lock:
            state = self._states.pop(backend, None)
            if state is not None:
                GENERATION.bump()

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per-backend state for doctor/explain (JSON-serializable)."""
        now = self._clock()
        return {
            name: {"failures": s.failures, "open": s.open_until is not None and now < s.open_until,
                   "last_error": s.last_error}
            for name, s in self._states.items()
        }
