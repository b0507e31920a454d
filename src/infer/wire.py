"""What crosses between the API server and the engine core: typed messages, msgpack on the wire (msgspec).

The hot path is two messages: a request going in (`CoreRequest`) and one step's outputs coming out
(`CoreOutputs` around a `CoreStep`: the step's plain tokens as two columns, request ids and token ids, and
whole `CoreOutput`s only where there is more to say: a first output, a finish reason, logprobs, probe
scores). Everything else (aborts, utility calls, heartbeats, the core's start-up facts) is small and rare.
Beside the messages: what both sides check a request against (`validate_prompt`, `check_probes`), so the API
server refuses what the core would. docs/architecture.md draws the two processes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from infer.sampling.logprobs import TokenLogprob
from infer.sampling.params import SamplingParams

if TYPE_CHECKING:
    from infer.engine.config import EngineConfig
    from infer.families.config import ModelConfig
    from infer.loader.tokenizer import Tokenizer


@dataclass(frozen=True)
class ProbeInfo:
    """One loaded probe, as `LLM.probes()` and the server's `GET /v1/probes` list it."""

    name: str
    layer: int
    activation: str
    source: str
    sha256: str
    version: int


class _LoadedProbes(Protocol):  # omniscience's ProbeLayout, read without importing it (it holds torch weights)
    probes: tuple[Any, ...]
    columns: dict[str, int]
    version: int


@dataclass(frozen=True)
class ProbeCatalog:
    """The loaded probe set as the request side sees it: names, score columns, version; no weights."""

    probes: tuple[ProbeInfo, ...]
    columns: dict[str, int]
    version: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)

    @classmethod
    def of(cls, layout: _LoadedProbes | None) -> ProbeCatalog | None:
        if layout is None:
            return None
        infos = tuple(ProbeInfo(p.name, p.layer, p.activation, str(p.source), p.sha256, layout.version)
                      for p in layout.probes)
        return cls(infos, dict(layout.columns), layout.version)


@dataclass(frozen=True)
class CoreInfo:
    """What an API server needs of the core, sent once it is ready (pickled: the tokenizer travels as its JSON)."""

    address: str  # the ZMQ endpoint to connect to
    config: EngineConfig  # as built: max_seq_len bounded by the model, the device resolved
    model_config: ModelConfig
    model_path: str
    tokenizer: Tokenizer  # the core's own, so the API server never loads transformers (or torch)
    vocab_size: int
    probes: ProbeCatalog | None
    load_seconds: float
    warmup_seconds: float
    pid: int


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for metrics: running requests, KV blocks, preemptions, prefix-cache tokens, speculation."""

    num_running: int
    kv_blocks_total: int
    kv_blocks_free: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    spec_drafted: int = 0  # speculation: draft tokens verified
    spec_accepted: int = 0  # of which accepted
    spec_verified_rows: int = 0  # request-steps that verified drafts (accepted / rows + 1 = mean tokens per such step)
    lora_requests: tuple[tuple[str, int, int], ...] = ()  # per LoRA adapter in use: (name, running, waiting)


def validate_prompt(prompt_token_ids: list[int], max_seq_len: int, vocab_size: int) -> None:
    """Raise ValueError for a prompt an engine of this context and vocabulary cannot run."""
    if not prompt_token_ids:
        raise ValueError("prompt is empty: at least one token is needed")
    if len(prompt_token_ids) >= max_seq_len:
        raise ValueError(f"prompt has {len(prompt_token_ids)} tokens; max_seq_len={max_seq_len} leaves no room to generate")
    bad = next((t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab_size})")


def check_probes(params: SamplingParams, probes: ProbeCatalog | None) -> tuple[str, ...]:
    """The probe names a request's outputs will carry under the loaded `probes`; ValueError (naming the field) for
    ones not loaded."""
    if params.probe_prompt and params.probes is None:
        raise ValueError("probe_prompt: needs probes (true or a list of names); it adds their prompt-token scores")
    if params.probes is None and params.probe_stop is None:
        return ()
    if probes is None:
        field = "probes" if params.probes is not None else "probe_stop"
        raise ValueError(f"{field}: no probe set is loaded (start the engine with a probe set: --probes FILE)")
    names = probes.names if params.probes is True else tuple(params.probes or ())
    unknown = [n for n in names if n not in probes.columns]
    if unknown:
        raise ValueError(f"probes: unknown probe(s) {', '.join(map(repr, unknown))}; loaded: {', '.join(probes.names)}")
    if params.probe_stop is not None and params.probe_stop.name not in probes.columns:
        raise ValueError(f"probe_stop: unknown probe {params.probe_stop.name!r}; loaded: {', '.join(probes.names)}")
    return names


class CoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """A tokenized, validated request for the core to schedule."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class CoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's token for one request (or its end without a token: abort, error, prompt scoring only).

    The core never formats text: detokenization, stop strings and the OpenAI shapes happen beside the
    API (infer/frontend/text.py)."""

    request_id: str
    token_id: int | None
    finish_reason: str | None = None
    error: str | None = None
    client_error: bool = False  # the error comes from the request itself (a constraint the tokenizer cannot meet)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_seconds: float | None = None  # arrival to first scheduling, on the first output
    logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first output, when asked
    probes: list[float | None] | None = None  # the token's score per asked probe (None: a reload removed it)
    prompt_probes: dict[str, list[float | None]] | None = None  # on the first output, with probe_prompt
    embedding: list[float] | None = None  # an embedding request's pooled, normalized final hidden state

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class CoreStep(msgspec.Struct, array_like=True, gc=False):
    """What one step emitted. A plain token (its request keeps running, asks nothing of it but the token and its
    probe scores, and has had its first output) is a row of the columns; every other output is whole. The columns
    come first: a whole output of the same step (an abort, an error) may end a request after its token."""

    request_ids: list[str] = []
    token_ids: list[int] = []
    probes: list[list[float | None] | None] = []  # a row's asked probe scores; empty when no row has any
    outputs: list[CoreOutput] = []


class CoreOutputs(msgspec.Struct, array_like=True, gc=False):
    """One step's outputs for one API server, with the core's queue lengths (admission control, /metrics) and how
    many of this API server's requests the core has taken in so far (the rest are still on their way)."""

    emitted: CoreStep
    num_waiting: int
    num_running: int
    received: int = 0


class Abort(msgspec.Struct, array_like=True, tag=True):
    """End requests: the client left (reason "abort"), or a stop string was found in their text ("stop")."""

    request_ids: list[str]
    reason: str = "abort"


class Add(msgspec.Struct, array_like=True, tag=True):
    """New requests. The API server encodes each on its own when it is submitted (`encode_request`) and sends
    them as `EncodedAdd`, so a request that cannot be encoded fails alone, before it is counted anywhere."""

    requests: list[CoreRequest]


class EncodedAdd(msgspec.Struct, array_like=True, tag="Add"):
    """`Add` as the API server sends it: the same bytes on the wire, its requests encoded already."""

    requests: list[msgspec.Raw]


class Call(msgspec.Struct, array_like=True, tag=True):
    """A utility call run between two steps (stats, audits, a probe reload); answered by `Reply` with its id."""

    call_id: int
    method: str
    args: list[Any] = []


class Heartbeat(msgspec.Struct, array_like=True, tag=True):
    """An API server is alive; it carries its serving metrics so any server's /metrics can count them all."""

    metrics: dict[str, Any] = {}


PROBES_CHANGED = -1  # a Reply's call id when the core tells every API server its new probe catalog
LORAS_CHANGED = -2  # ... its LoRA adapters (name -> path) after one was loaded or unloaded


class Reply(msgspec.Struct, array_like=True, tag=True):
    call_id: int
    result: Any = None
    error: str | None = None


class Outputs(msgspec.Struct, array_like=True, tag=True):
    step: CoreOutputs


class Shutdown(msgspec.Struct, array_like=True, tag=True):
    """The core is going away (a crash, with its reason, or a stop)."""

    reason: str


ToCore = Add | Abort | Call | Heartbeat
FromCore = Outputs | Reply | Shutdown

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)


def encode(message: ToCore | FromCore | EncodedAdd) -> bytes:
    return _encoder.encode(message)


class UnsendableRequest(ValueError):
    """A request that cannot be put on the wire (text that is not valid Unicode); `param` names its field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def encode_request(request: CoreRequest) -> msgspec.Raw:
    """One request as msgpack, for `Add`; UnsendableRequest naming the field that cannot be encoded."""
    try:
        return msgspec.Raw(_encoder.encode(request))
    except (msgspec.EncodeError, UnicodeError, TypeError, OverflowError) as exc:
        param = _unsendable_field(request)
        raise UnsendableRequest(f"{param} cannot be sent to the engine: {exc}", param) from exc


def _unsendable_field(request: CoreRequest) -> str:
    try:
        _encoder.encode(request.prompt_token_ids)
    except (msgspec.EncodeError, UnicodeError, TypeError, OverflowError):
        return "prompt"
    for f in fields(request.params):
        try:
            _encoder.encode(getattr(request.params, f.name))
        except (msgspec.EncodeError, UnicodeError, TypeError, OverflowError):
            return f.name
    return "prompt"


def decode_to_core(data: bytes) -> ToCore:
    return _to_core.decode(data)


def decode_from_core(data: bytes) -> FromCore:
    return _from_core.decode(data)
