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
PENALTY_LIMIT = 2.0  # OpenAI's range for presence_penalty and frequency_penalty: [-2, 2]
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]; -100 bans the token


@dataclass(frozen=True)
class ProbeStop:
    """End a request (finish reason "content_filter") once probe `name` scores above `above` or below `below`."""

    name: str
    above: float | None = None
    below: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"probe_stop.name must be a probe name, got {self.name!r}")
        if self.above is None and self.below is None:
            raise ValueError("probe_stop needs a threshold: above, below or both")
        for key in ("above", "below"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                raise ValueError(f"probe_stop.{key} must be a finite number, got {value!r}")

    def crossed(self, score: float) -> bool:
        return (self.above is not None and score > self.above) or (self.below is not None and score < self.below)


POOLINGS = ("last", "mean", "cls")  # how an embedding request pools the prompt's final hidden states

@dataclass
class SamplingParams:
    """How one request picks tokens; invalid values raise ValueError naming the field."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # None, 0 or -1: disabled (stored as None)
    min_p: float = 0.0  # vLLM's: after temperature, tokens less likely than min_p times the likeliest are cut; 0: off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from the logit of every token generated so far
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per occurrence among the tokens generated so far
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit; -100 bans it
    min_tokens: int = 0  # vLLM's: EOS is held back until this many tokens have been generated
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's logprob and the k most likely
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none)
    structured: Constraint | None = None  # what the output must match (infer/structured)
    # Probe scores (omniscience; the engine checks the names against its loaded set): True = every loaded probe,
    # or a list of names; probe_prompt adds a score per prompt token; probe_stop ends the request on a threshold.
    probes: bool | list[str] | None = None
    probe_prompt: bool = False
    probe_stop: ProbeStop | None = None
    # Output text (vLLM's): special tokens left out of the text, and a stop string kept at its end
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Embedding instead of generating (max_tokens must be 0): the prompt's final hidden states pooled ("last": the
    # last token's, "mean": all positions', "cls": the first's) and L2-normalized, returned on the final output
    pooling: str | None = None
    # The LoRA adapter (its registered name) the request runs; None: the base model (docs/lora.md)
    lora: str | None = None

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
        self.min_p = _real("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}")
        if not _is_int(self.max_tokens) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        self._check_logit_adjustments()
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")
        self.stop = _stop_list(self.stop)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        self._check_probes()
        for name in ("skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.pooling is not None and self.max_tokens != 0:
            raise ValueError(f"pooling embeds the prompt and generates nothing: max_tokens must be 0, got {self.max_tokens}")
        if self.lora is not None and (not isinstance(self.lora, str) or not self.lora):
            raise ValueError(f"lora must be the name of a loaded adapter or None, got {self.lora!r}")
        if self.structured is not None and not isinstance(self.structured, Constraint):
            raise ValueError(f"structured must be an infer.structured.Constraint, got {type(self.structured).__name__}")

    def _check_logit_adjustments(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = _real(name, getattr(self, name))
            if not (math.isfinite(value) and -PENALTY_LIMIT <= value <= PENALTY_LIMIT):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            setattr(self, name, value)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
            bias: dict[int, float] = {}
            for token, value in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
                value = _real("logit_bias", value)
                if not (math.isfinite(value) and -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT):
                    raise ValueError(f"logit_bias values must be in [-100, 100], got {value} for token {token}")
                bias[token] = value
            self.logit_bias = bias or None
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")

    def _check_probes(self) -> None:
        if self.probes is False:
            self.probes = None
        if self.probes is not None and self.probes is not True:
            if not isinstance(self.probes, (list, tuple)) or not all(isinstance(n, str) and n for n in self.probes):
                raise ValueError(f"probes must be true or a list of probe names, got {self.probes!r}")
            if len(set(self.probes)) != len(self.probes):
                raise ValueError(f"probes names a probe twice: {list(self.probes)}")
            self.probes = list(self.probes) or None
        if not isinstance(self.probe_prompt, bool):
            raise ValueError(f"probe_prompt must be a boolean, got {self.probe_prompt!r}")
        if self.probe_stop is not None and not isinstance(self.probe_stop, ProbeStop):
            raise ValueError(f"probe_stop must be an infer.sampling.params.ProbeStop, got {type(self.probe_stop).__name__}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or below GREEDY_BELOW) means argmax decoding."""
        return self.temperature < GREEDY_BELOW

    @property
    def cuts_min_p(self) -> bool:
        """A sampled row with min_p > 0 (greedy rows take the argmax, which min_p never cuts)."""
        return not self.greedy and self.min_p > 0

    @property
    def needs_history(self) -> bool:
        """The repetition penalty reads every earlier token on the host each step."""
        return self.repetition_penalty != 1.0

    @property
    def counts_output(self) -> bool:
        """A presence or frequency penalty: the row's generated-token counts are kept on the device."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0


def _is_int(value: object) -> bool:
    """A real integer; bool is excluded so `top_k=True` is not silently 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _real(name: str, value: object) -> float:
    """Coerce an int or float to float; anything else is a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


MAX_STOP_STRINGS = 16  # OpenAI takes 4, TGI 4 by default; each is matched against every streamed token's text
MAX_STOP_CHARS = 512


def _stop_list(stop: object) -> list[str]:
    """Accept None, one string or a list of strings; empty strings would match everywhere, so drop them.
    At most MAX_STOP_STRINGS strings of at most MAX_STOP_CHARS characters: their cost is paid per token."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ValueError(f"stop must be a string or a list of strings, got {_clip(stop)}")
    stops = [s for s in items if s]
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"stop strings are at most {MAX_STOP_CHARS} characters long, got one of {longest}")
    return stops


def _clip(value: object, limit: int = 200) -> str:
    """repr(value), cut to `limit` characters (an error message echoes what it refuses, not all of it)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
