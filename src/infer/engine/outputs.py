"""Turning a sampled token into a request's StepOutput: detokenize, stop strings, EOS, finish reasons."""

from __future__ import annotations

from infer.engine.request import Request, StepOutput
from infer.engine.scheduler import Scheduler
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

    def process(self, request: Request, result: StepResult, row: int) -> StepOutput:
        """The output of the token sampled for `request` at `row` of a step."""
        prompt_logprobs = result.prompt_logprobs[row] if result.prompt_logprobs else None
        params = request.sampling_params
        if params.max_tokens == 0:  # prompt scoring only (echo with logprobs): nothing is generated
            self.scheduler.finish(request, "length")
            return self.output(request, None, "", "length", prompt_logprobs=prompt_logprobs)
        token = result.token_ids[row]
        request.append_output(token)
        if request.grammar is not None and request.grammar.error is not None:
            error = f"the output constraint cannot be met with this model's tokenizer: {request.grammar.error}"
            return self.fail(request, error, client_error=True)
        is_eos = token in self._eos and not params.ignore_eos
        text = request.text
        if not is_eos:
            request.detokenizer.push(token)
            text = request.detokenizer.text
        reason = self._finish_reason(request, is_eos)
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
        return self.output(request, token, delta, reason, logprob=logprob, prompt_logprobs=prompt_logprobs)

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
    ) -> StepOutput:
        """One step's output for a request; finished once there is a finish reason."""
        first = not request.outputs_sent
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
        )

    def _finish_reason(self, request: Request, is_eos: bool) -> str | None:
        if is_eos or (request.grammar is not None and request.grammar.complete):  # the grammar has ended
            return "stop"
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
            return "length"
        if request.num_tokens >= self.max_seq_len:
            return "length"
        return None
