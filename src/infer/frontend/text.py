"""The text side of output processing: the core's tokens into text deltas, stop strings, StepOutputs.

It runs where the caller is, never in the engine core: in the API server process (infer/frontend/client.py) and,
for offline use, beside the in-process engine (infer/build/in_process.py). One implementation serves both.
A stop string ends a request here first; the caller then tells the core to end it (`take_stopped`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from infer.wire import CoreOutput, CoreStep
from infer.frontend.outputs import ProbeScores, StepOutput
from infer.loader.detokenizer import IncrementalDetokenizer
from infer.loader.tokenizer import Tokenizer
from infer.sampling.params import SamplingParams
from infer.sampling.stop import StopChecker


@dataclass(slots=True)
class TextState:
    """One request's text so far: its detokenizer, stop strings and what has been emitted."""

    detokenizer: IncrementalDetokenizer
    stop_checker: StopChecker
    ignore_eos: bool
    probe_index: dict[str, int]  # asked probe name -> its position in the core's score rows
    incremental: bool  # text per token; otherwise only at the end (no stop strings, nobody reads deltas)
    prompt_tokens: int
    min_tokens: int = 0  # stop strings count only from the token after these (vLLM's rule for min_tokens)
    include_stop: bool = False  # the text ends with the stop string that ended it (include_stop_str_in_output)
    cached_tokens: int = 0  # as the core last said (a plain token's columns do not carry it)
    text: str = ""  # output text, cut at a stop string once one is hit
    emitted_chars: int = 0
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)  # generated ids up to its end (a stop string's token included)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class TextProcessor:
    """Per request a TextState; `process_step` turns a core step's outputs into the caller's StepOutputs."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._eos = tokenizer.eos_token_ids
        self.states: dict[str, TextState] = {}
        self._stopped: list[str] = []  # ended by a stop string here, still running in the core

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            probe_names: tuple[str, ...] = (), incremental: bool = True) -> TextState:
        """Track a request's text. With `incremental` off its tokens are decoded once, when it ends (its deltas are
        empty until then, the last one holding the whole text): for a caller that reads only the final text. Stop
        strings need the text as it grows, so they keep it incremental."""
        index = {name: i for i, name in enumerate(probe_names)}
        detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
        state = TextState(detokenizer, StopChecker(params.stop), params.ignore_eos, index,
                          incremental or bool(params.stop), len(prompt_token_ids), params.min_tokens,
                          include_stop=params.include_stop_str_in_output)
        self.states[request_id] = state
        return state

    def take_stopped(self) -> list[str]:
        """Requests that a stop string ended since the last call: the core must end them too (reason "stop")."""
        stopped, self._stopped = self._stopped, []
        return stopped

    def finish(self, request_id: str, error: str) -> StepOutput | None:
        """End a request from this side (its core is gone): its final, failed output; None if already ended."""
        return self.process(CoreOutput(request_id, None, "error", error))

    def process_step(self, step: CoreStep) -> list[StepOutput]:
        """The caller's outputs of one core step: its plain tokens first, then its whole outputs (see CoreStep).
        Tokens of a request unknown here or already ended are dropped (see `process`)."""
        outputs = []
        states = self.states
        probe_rows = step.probes or itertools.repeat(None)
        for request_id, token, values in zip(step.request_ids, step.token_ids, probe_rows):
            state = states.get(request_id)
            if state is None or state.finished:
                continue
            if state.incremental:
                delta, reason = self._advance(state, request_id, token, None)
            else:  # a plain token is text (it ends nothing) and no stop string waits on it: held for the end
                state.token_ids.append(token)
                state.detokenizer.hold(token)
                delta, reason = "", None
            probes = None if values is None else ProbeScores(state.probe_index, values)
            outputs.append(StepOutput(request_id, token, delta, reason is not None, reason, None, state.prompt_tokens,
                                      len(state.token_ids), cached_tokens=state.cached_tokens, probes=probes))
        for out in step.outputs:
            if (converted := self.process(out)) is not None:
                outputs.append(converted)
        return outputs

    def process(self, out: CoreOutput) -> StepOutput | None:
        """The caller's output for one core output; None for a request unknown here or already ended (the
        tokens the core sampled after a stop string, before it heard of the stop)."""
        state = self.states.get(out.request_id)
        if state is None or state.finished:
            return None
        state.cached_tokens = out.cached_tokens
        delta, reason = self._advance(state, out.request_id, out.token_id, out.finish_reason)
        probes = None if out.probes is None else ProbeScores(state.probe_index, out.probes)
        return StepOutput(out.request_id, out.token_id, delta, reason is not None, reason, out.error,
                          out.prompt_tokens, out.completion_tokens, out.logprob, out.prompt_logprobs,
                          out.queue_seconds, out.cached_tokens, out.client_error, probes, out.prompt_probes,
                          out.embedding)

    def _advance(self, state: TextState, request_id: str, token: int | None, reason: str | None
                 ) -> tuple[str, str | None]:
        """Take a token (None: none) and the core's finish reason into the request's text: (the new text delta,
        the finish reason: the core's, or "stop" when a stop string ended the text here)."""
        text = state.text
        detokenizer, is_text = state.detokenizer, False
        if token is not None:
            state.token_ids.append(token)
            is_text = state.ignore_eos or token not in self._eos
            if is_text and not state.incremental:
                detokenizer.hold(token)
            elif is_text:
                detokenizer.push(token)
                if reason is not None:
                    detokenizer.flush()
                text = detokenizer.text
        if reason is not None and not state.incremental:  # as the pushes would have: complete when it ends on text
            detokenizer.flush(keep_incomplete=is_text)
            text = detokenizer.text
        stops = state.stop_checker
        counts = stops.stops and len(state.token_ids) > state.min_tokens  # text before that is never searched
        stop_at = stops.match(text, len(state.text)) if counts else None
        if stop_at is not None:
            text = text[: stop_at[1] if state.include_stop else stop_at[0]]
            if reason is None:
                self._stopped.append(request_id)
            reason = "stop"
        state.text = text
        visible = len(text) if reason or not stops.stops else len(text) - stops.holdback(text)
        delta = text[state.emitted_chars : max(visible, state.emitted_chars)]
        state.emitted_chars += len(delta)
        if reason is not None:
            state.finish_reason = reason
            del self.states[request_id]
        return delta, reason
