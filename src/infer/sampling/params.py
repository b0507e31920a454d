"""Per-request sampling parameters, normalised and validated once at the API boundary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infer.sampling.logprobs import MAX_LOGPROBS
from infer.structured.constraint import Constraint

SEED_LIMIT = 2**63
# Below this, logits / temperature overflows float32; such temperatures decode greedily (as vLLM does).
GREEDY_BELOW = 1e-5
_TOP_K_DISABLED = (None, 0, -1)


@dataclass
class SamplingParams:
    """How one request picks tokens; invalid values raise ValueError naming the field."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # None, 0 or -1: disabled (stored as None)
    repetition_penalty: float = 1.0
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's logprob and the k most likely
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none)
    structured: Constraint | None = None  # what the output must match (infer/structured)

    def __post_init__(self) -> None:
        self.temperature = _real("temperature", self.temperature)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        self.top_p = _real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k in _TOP_K_DISABLED:
            self.top_k = None
        elif not _is_int(self.top_k) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1 (or None/0/-1 to disable), got {self.top_k!r}")
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}")
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")
        self.stop = _stop_list(self.stop)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.structured is not None and not isinstance(self.structured, Constraint):
            raise ValueError(f"structured must be an infer.structured.Constraint, got {type(self.structured).__name__}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below GREEDY_BELOW) means argmax decoding."""
        return self.temperature < GREEDY_BELOW

    @property
    def needs_history(self) -> bool:
        """The repetition penalty reads every earlier token on the host each step."""
        return self.repetition_penalty != 1.0


def _is_int(value: object) -> bool:
    """A real integer; bool is excluded so `top_k=True` is not silently 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _real(name: str, value: object) -> float:
    """Coerce an int or float to float; anything else is a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _stop_list(stop: object) -> list[str]:
    """Accept None, one string or a list of strings; empty strings would match everywhere, so drop them."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    return [s for s in items if s]
