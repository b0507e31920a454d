"""Turning a sampled token into a request's CoreOutput: EOS, length limits, grammar ends, probe scores, finish reasons.

This runs in the engine core and never formats text; detokenization and stop strings run beside the API
(infer/frontend/text.py), which tells the core to end a request whose text hit a stop string."""

from __future__ import annotations

import numpy as np

from infer.engine.decode_table import DecodeRows
from infer.wire import CoreOutput, CoreStep
from infer.engine.request import Request
from infer.engine.scheduler import ScheduledRow, Scheduler
from infer.runners.step import StepResult
from infer.sampling.logprobs import TokenLogprob
from omniscience import ProbeLayout


class OutputProcessor:
    """One output per request per token: a plain decode token as a row of the step's columns, every other one a
    CoreOutput; a finish reason ends the request through the scheduler."""

    def __init__(self, eos_token_ids: frozenset[int], scheduler: Scheduler, max_seq_len: int) -> None:
        self._eos = eos_token_ids
        self._eos_ids = np.array(sorted(eos_token_ids), dtype=np.int64)
        self.scheduler = scheduler
        self.max_seq_len = max_seq_len
        self._columns: dict[tuple[int, tuple[str, ...]], np.ndarray] = {}  # (version, names) -> their columns
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._selections: dict[int, list[list[float | None]]] = {}  # id(names) -> this step's scores of those names
        self._selections_of: StepResult | None = None
        self._plain_ids: list[str] = []  # this step's plain tokens, until `take_step`
        self._plain_tokens: list[int] = []
        self._plain_probes: list[list[float | None] | None] = []

    def take_step(self, outputs: list[CoreOutput]) -> CoreStep:
        """The step's outputs: the plain tokens collected since the last call as columns, then `outputs`."""
        probes = self._plain_probes if any(self._plain_probes) else []
        step = CoreStep(self._plain_ids, self._plain_tokens, probes, outputs)
        self._plain_ids, self._plain_tokens, self._plain_probes = [], [], []
        return step

    def process(self, request: Request, result: StepResult, row: int) -> list[CoreOutput]:
        """The outputs of the tokens a step produced for `request` at `row`: one, or with speculation the accepted
        run, applied token by token (an EOS, stop string or length limit drops the tokens after it)."""
        out = [self._process(request, result, row, result.token_ids[row])]
        for token in result.extra_tokens[row] if result.extra_tokens else ():
            if request.finished:
                break
            out.append(self._process(request, result, row, token))
        return out

    def process_decode(self, rows: DecodeRows, result: StepResult) -> list[CoreOutput]:
        """The outputs of the decode table's rows, the step's first: which tokens end their request (EOS, a length
        limit) is decided for all rows at once from the table's arrays, and asked probe scores come from the step's one
        selection per name list; a row whose request needs more per token (a grammar, logprobs, probe_stop) goes
        through `process`. A token that ends nothing, of a request that has had its first output, joins the step's
        columns (`take_step`) with its probe scores instead of becoming a CoreOutput. A request that ended while
        the step was in flight (a stop string, an abort) drops its token."""
        tokens = np.asarray(result.token_ids[: len(rows.requests)], dtype=np.int64)
        # the token at position context_len ends the request once the known tokens reach its limit
        eos = rows.stops_at_eos & np.isin(tokens, self._eos_ids)
        ends = np.where(eos, 1, (rows.context_lens + 1 >= rows.limits) * 2)
        out: list[CoreOutput] = []
        plain_ids, plain_tokens, plain_probes = self._plain_ids, self._plain_tokens, self._plain_probes
        scores = result.probe_scores
        for i, (request, token, end, plain) in enumerate(zip(rows.requests, tokens.tolist(), ends.tolist(),
                                                              rows.plain.tolist())):
            if request.finished:
                continue
            if not plain:
                out += self.process(request, result, i)
                continue
            request.append_output(token)
            names = request.probe_names
            probes = self._named_scores(names, result, i) if names and scores is not None else None
            if not end and request.outputs_sent:
                plain_ids.append(request.request_id)
                plain_tokens.append(token)
                plain_probes.append(probes)
                continue
            reason = _ENDS[end]
            if reason is not None:
                self.scheduler.finish(request, reason)
            out.append(self.output(request, token, reason, probes=probes))
        return out

    def _process(self, request: Request, result: StepResult, row: int, token: int) -> CoreOutput:
        params = request.sampling_params
        prompt_logprobs = request.prompt_logprobs if params.prompt_logprobs is not None and not request.outputs_sent \
            else None
        if params.max_tokens == 0:  # prompt scoring (echo with logprobs) or an embedding: nothing is generated
            self.scheduler.finish(request, "length")
            out = self.output(request, None, "length", prompt_logprobs=prompt_logprobs)
            if params.pooling is not None:
                out.embedding = _embedding(request)
            return out
        request.append_output(token)
        probes, stopped = self._probe_scores(request, result, row)
        if request.grammar is not None and request.grammar.error is not None:
            return self.fail(request, request.grammar.error, client_error=True)
        is_eos = token in self._eos and not params.ignore_eos
        reason = self._finish_reason(request, is_eos) or ("content_filter" if stopped else None)
        if reason is not None:
            self.scheduler.finish(request, reason)
        logprob = result.logprobs[row] if result.logprobs else None
        return self.output(request, token, reason, logprob=logprob, prompt_logprobs=prompt_logprobs, probes=probes)

    def shared_names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """One tuple object per distinct probe-name list, for the requests' `probe_names` (see _probe_scores)."""
        if len(self._names) > 4096:  # many distinct lists: start over (a later equal list gets its own selection)
            self._names.clear()
        return self._names.setdefault(names, names)

    def _probe_scores(self, request: Request, result: StepResult, row: int) -> tuple[list[float | None] | None, bool]:
        """(the step's scores of the probes the request asked for, whose row `row` is its token's; whether its
        probe_stop threshold was crossed).
        Per step, each distinct name list gets one column selection that its requests share (keyed by the
        tuple's id: a request keeps its names alive, so ids are unique within the step)."""
        scores = result.probe_scores
        names, stop = request.probe_names, request.sampling_params.probe_stop
        if scores is None or not (names or stop):
            return None, False
        probes = self._named_scores(names, result, row) if names else None
        stopped = False
        if stop is not None and result.probe_layout is not None:
            column = result.probe_layout.columns.get(stop.name)
            stopped = column is not None and stop.crossed(float(scores[row, column]))
        return probes, stopped

    def _named_scores(self, names: tuple[str, ...], result: StepResult, row: int) -> list[float | None]:
        """Row `row`'s scores of `names`, from the step's one selection for that name list."""
        if self._selections_of is not result:
            self._selections, self._selections_of = {}, result
        selection = self._selections.get(id(names))
        if selection is None:
            selection = self._selections[id(names)] = self._select(names, result)
        return selection[row]

    def _select(self, names: tuple[str, ...], result: StepResult) -> list[list[float | None]]:
        """The step's scores of `names` per row, in their order, as lists: None for a probe the loaded set no longer
        has (or a NaN score), decided for the whole step at once rather than per row and score."""
        layout, scores = result.probe_layout, result.probe_scores
        assert layout is not None and scores is not None
        key = (layout.version, names)
        columns = self._columns.get(key)
        if columns is None:
            if len(self._columns) > 4096:  # selections of sets reloaded since, or many distinct name lists
                self._columns.clear()
            columns = self._columns[key] = np.array([layout.columns.get(n, -1) for n in names])
        view = scores[:, np.maximum(columns, 0)]
        missing = np.isnan(view) | (columns < 0)
        if not missing.any():
            return view.tolist()
        listed = view.astype(object)
        listed[missing] = None
        return listed.tolist()

    @staticmethod
    def collect_prompt_probes(rows: list[ScheduledRow], layout: ProbeLayout | None, chunks: list[np.ndarray]) -> None:
        """Keep the prompt-position scores a step read back for `rows` (one chunk each); positions a recomputation
        repeats are skipped."""
        if layout is None:
            return
        for row, chunk in zip(rows, chunks):
            request = row.request
            skip = request.prompt_probe_positions - row.start
            if not len(chunk) or request.finished or skip < 0 or skip >= len(chunk):
                continue
            for name in request.probe_names:
                column = layout.columns.get(name)
                values = chunk[skip:, column].tolist() if column is not None else [None] * (len(chunk) - skip)
                request.prompt_probes.setdefault(name, []).extend(values)
            request.prompt_probe_positions = row.start + len(chunk)

    @staticmethod
    def collect_pooled(rows: list[ScheduledRow], chunks: list[np.ndarray | None]) -> None:
        """Add what a step pooled of each embedding row's chunk to its request (a sum, for "mean")."""
        for row, pooled in zip(rows, chunks):
            request = row.request
            if pooled is None or request.finished:
                continue
            request.pooled = pooled if request.pooled is None or row.pooling != "mean" else request.pooled + pooled
            request.pooled_positions = row.start + row.num_new

    @staticmethod
    def collect_prompt_logprobs(rows: list[ScheduledRow], chunks: list[list[TokenLogprob] | None]) -> None:
        """Keep the prompt logprobs a step computed for `rows`: a row's values are those of the prompt tokens at
        positions start + 1, start + 2, ...; positions a recomputation repeats are skipped."""
        for row, values in zip(rows, chunks):
            request = row.request
            if not values or request.finished:
                continue
            skip = len(request.prompt_logprobs) - (row.start + 1)
            if 0 <= skip < len(values):
                request.prompt_logprobs.extend(values[skip:])

    def fail(self, request: Request, error: str, client_error: bool = False) -> CoreOutput:
        self.scheduler.finish(request, "error", failed=True)
        out = self.output(request, None, "error", error)
        out.client_error = client_error
        return out

    def abort(self, request: Request, reason: str = "abort") -> CoreOutput:
        self.scheduler.finish(request, reason)
        return self.output(request, None, reason)

    def output(
        self,
        request: Request,
        token: int | None,
        reason: str | None,
        error: str | None = None,
        logprob: TokenLogprob | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
        probes: list[float | None] | None = None,
    ) -> CoreOutput:
        """One step's output for a request; finished once there is a finish reason."""
        if request.outputs_sent:
            return CoreOutput(request.request_id, token, reason, error, False, len(request.prompt_token_ids),
                              len(request.output_token_ids), request.num_cached_tokens, None, logprob, None, probes)
        request.outputs_sent = True
        scheduled = request.first_scheduled_time
        return CoreOutput(
            request_id=request.request_id,
            token_id=token,
            finish_reason=reason,
            error=error,
            prompt_tokens=len(request.prompt_token_ids),
            completion_tokens=len(request.output_token_ids),
            cached_tokens=request.num_cached_tokens,
            queue_seconds=scheduled - request.arrival_time if scheduled is not None else None,
            logprob=logprob,
            prompt_logprobs=prompt_logprobs,
            probes=probes,
            prompt_probes=request.prompt_probes if request.sampling_params.probe_prompt else None,
        )

    def _finish_reason(self, request: Request, is_eos: bool) -> str | None:
        if is_eos or (request.grammar is not None and request.grammar.complete):  # the grammar has ended
            return "stop"
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
            return "length"
        if request.num_tokens >= self.max_seq_len:
            return "length"
        return None


_ENDS = (None, "stop", "length")  # process_decode's end codes: none, EOS, a length limit


def _embedding(request: Request) -> list[float]:
    """The request's pooled hidden state (a mean for "mean"), L2-normalized."""
    mean = request.sampling_params.pooling == "mean"
    if request.pooled is None or (mean and request.pooled_positions < len(request.prompt_token_ids)):
        raise RuntimeError(f"{request.request_id!r}: pooled {request.pooled_positions} of "
                           f"{len(request.prompt_token_ids)} prompt positions")
    vector = request.pooled.astype(np.float64)
    if mean:
        vector = vector / len(request.prompt_token_ids)
    return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32).tolist()
