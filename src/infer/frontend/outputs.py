"""What a caller sees of one step of one request (`StepOutput`, text included) and its probe scores: made from the
core's `CoreOutput` by the text processor (text.py), in the API server and beside an in-process engine."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from infer.sampling.logprobs import TokenLogprob


class ProbeScores(Mapping[str, "float | None"]):
    """A token's score per asked probe (None: a reload removed it), read from the step's row of scores: a mapping
    without a dict built per row and token, which at 64 rows of 64 probes was most of the probes' host cost."""

    __slots__ = ("index", "row")

    def __init__(self, index: dict[str, int], row: list[float | None]) -> None:
        self.index = index  # name -> position in `row`; one dict shared by all of a request's tokens
        self.row = row  # the scores in the request's probe-name order

    def __getitem__(self, name: str) -> float | None:
        return self.row[self.index[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return f"ProbeScores({dict(zip(self.index, self.row))!r})"


def probe_columns(rows: list[ProbeScores]) -> dict[str, list[float | None]]:
    """One request's per-token scores as a list per probe name (its rows share one name order)."""
    if not rows:
        return {}
    return {name: list(column) for name, column in zip(rows[0].index, zip(*(r.row for r in rows)))}


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one request, as its caller sees it (text included); exactly one per request
    has finished=True. Made from the core's CoreOutput by the text processor (infer/frontend/text.py)."""

    request_id: str
    token_id: int | None
    text_delta: str
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprob: TokenLogprob | None = None  # of token_id, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first output, when asked (first is None)
    queue_seconds: float | None = None  # arrival to first scheduling, on the first output
    cached_tokens: int = 0  # prompt tokens read from the prefix cache instead of computed
    client_error: bool = False  # the error comes from the request itself (a constraint the tokenizer cannot meet)
    probes: ProbeScores | None = None  # the token's score per asked probe
    prompt_probes: dict[str, list[float | None]] | None = None  # on the first output, when asked: per prompt token
    embedding: list[float] | None = None  # an embedding request's, on its final output

    def probe_dict(self) -> dict[str, float | None] | None:
        """The token's score per asked probe (None for one a reload removed) as a dict, or None without probes."""
        return None if self.probes is None else dict(zip(self.probes.index, self.probes.row))


def truncate_embedding(vector: list[float], dimensions: int | None) -> list[float]:
    """An embedding cut to its first `dimensions` values and L2-normalized again (OpenAI's `dimensions`); ValueError
    naming the field when it asks for more than the model has."""
    if dimensions is None:
        return vector
    if not 0 < dimensions <= len(vector):
        raise ValueError(f"dimensions must be between 1 and the model's {len(vector)}, got {dimensions}")
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]
