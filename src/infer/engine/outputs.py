"""Turning a sampled token into a request's StepOutput: detokenize, stop strings, EOS, probe scores, finish reasons."""

from __future__ import annotations

import numpy as np

from infer.engine.request import ProbeScores, Request, StepOutput
from infer.engine.scheduler import ScheduledRow, Scheduler
from infer.loader.tokenizer import Tokenizer
from infer.runners.step import StepResult
from infer.sampling.logprobs import TokenLogprob


class OutputProcessor:
    """One StepOutput per request per step; a finish reason ends the request through the scheduler."""

    def __init__(self, tokenizer: Tokenizer, scheduler: Scheduler, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self._eos = tokenizer.eos_token_ids
        self.scheduler = scheduler
        self.max_seq_len = max_seq_len
        self._columns: dict[tuple[int, int], tuple[tuple[str, ...], np.ndarray]] = {}  # (version, id(names)) -> columns
        self._views: dict[int, np.ndarray] = {}  # this step's score columns per column selection
        self._views_of: StepResult | None = None

    def process(self, request: Request, result: StepResult, row: int) -> StepOutput:
        """The output of the token sampled for `request` at `row` of a step."""
        prompt_logprobs = result.prompt_logprobs[row] if result.prompt_logprobs else None
        params = request.sampling_params
        if params.max_tokens == 0:  # prompt scoring only (echo with logprobs): nothing is generated
            self.scheduler.finish(request, "length")
            return self.output(request, None, "", "length", prompt_logprobs=prompt_logprobs)
        token = result.token_ids[row]
        request.append_output(token)
        probes, stopped = self._probe_scores(request, result, row)
        if request.grammar is not None and request.grammar.error is not None:
            error = f"the output constraint cannot be met with this model's tokenizer: {request.grammar.error}"
            return self.fail(request, error, client_error=True)
        is_eos = token in self._eos and not params.ignore_eos
        text = request.text
        if not is_eos:
            request.detokenizer.push(token)
            text = request.detokenizer.text
        reason = self._finish_reason(request, is_eos) or ("content_filter" if stopped else None)
        if reason is not None and not is_eos:
            request.detokenizer.flush()
            text = request.detokenizer.text
        stops = request.stop_checker
        stop_at = stops.check(text, len(request.text)) if stops.stops else None
        if stop_at is not None:
            text, reason = text[:stop_at], "stop"
        request.text = text
        visible = len(text) if reason or not stops.stops else len(text) - stops.holdback(text)
        delta = text[request.emitted_chars : max(visible, request.emitted_chars)]
        request.emitted_chars += len(delta)
        if reason is not None:
            self.scheduler.finish(request, reason)
        logprob = result.logprobs[row] if result.logprobs else None
        return self.output(request, token, delta, reason, logprob=logprob, prompt_logprobs=prompt_logprobs, probes=probes)

    def _probe_scores(self, request: Request, result: StepResult, row: int) -> tuple[ProbeScores | None, bool]:
        """(the scores the request asked for at its sampling row, whether its probe_stop threshold was crossed).
        Requests asking for the same probes share one column selection of the step's scores: a row view each."""
        layout, scores = result.probe_layout, result.probe_scores
        stop = request.sampling_params.probe_stop
        if layout is None or scores is None or not (request.probe_names or stop):
            return None, False
        probes = None
        names = request.probe_names
        if names:
            key = (layout.version, id(names))  # requests asking for every probe share one names tuple
            entry = self._columns.get(key)
            if entry is None:
                if len(self._columns) > 4096:  # selections of sets reloaded since, or many distinct name lists
                    self._columns.clear()
                entry = self._columns[key] = (names, np.array([layout.columns.get(n, -1) for n in names]))
            columns = entry[1]  # the entry keeps `names` alive, so its id is not reused while cached
            if self._views_of is not result:
                self._views, self._views_of = {}, result
            view = self._views.get(id(columns))
            if view is None:
                view = self._views[id(columns)] = scores[:, np.maximum(columns, 0)]
                view[:, columns < 0] = np.nan  # probes a reload removed
            probes = ProbeScores(names, view[row])
        stopped = False
        if stop is not None:
            column = layout.columns.get(stop.name)
            stopped = column is not None and stop.crossed(float(scores[row, column]))
        return probes, stopped

    @staticmethod
    def collect_prompt_probes(rows: list[ScheduledRow], result: StepResult) -> None:
        """Keep the prompt-position scores a step read back; positions a recomputation repeats are skipped."""
        layout, chunks = result.probe_layout, result.prompt_probe_scores
        if layout is None or chunks is None:
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

    def fail(self, request: Request, error: str, client_error: bool = False) -> StepOutput:
        self.scheduler.finish(request, "error", failed=True)
        out = self.output(request, None, "", "error", error)
        out.client_error = client_error
        return out

    def abort(self, request: Request) -> StepOutput:
        self.scheduler.finish(request, "abort")
        return self.output(request, None, "", "abort")

    def output(
        self,
        request: Request,
        token: int | None,
        delta: str,
        reason: str | None,
        error: str | None = None,
        logprob: TokenLogprob | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
        probes: ProbeScores | None = None,
    ) -> StepOutput:
        """One step's output for a request; finished once there is a finish reason."""
        first = not request.outputs_sent
        prompt_probes = request.prompt_probes if first and request.sampling_params.probe_prompt else None
        request.outputs_sent = True
        scheduled = request.first_scheduled_time
        return StepOutput(
            request_id=request.request_id,
            token_id=token,
            text_delta=delta,
            finished=reason is not None,
            finish_reason=reason,
            error=error,
            prompt_tokens=len(request.prompt_token_ids),
            completion_tokens=len(request.output_token_ids),
            logprob=logprob,
            prompt_logprobs=prompt_logprobs,
            queue_seconds=scheduled - request.arrival_time if first and scheduled is not None else None,
            cached_tokens=request.num_cached_tokens,
            probes=probes,
            prompt_probes=prompt_probes,
        )

    def _finish_reason(self, request: Request, is_eos: bool) -> str | None:
        if is_eos or (request.grammar is not None and request.grammar.complete):  # the grammar has ended
            return "stop"
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
            return "length"
        if request.num_tokens >= self.max_seq_len:
            return "length"
        return None
