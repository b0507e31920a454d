"""Engine.step(): schedule one batch, run it, turn sampled ids into detokenized, stop-checked outputs.

The scheduler (infer/engine/scheduler.py) decides what runs; the engine builds the runner's step
descriptor and turns sampled tokens into StepOutputs. Aborts are queued (any thread may call
`abort`) and applied at the start of the next step. step() does no I/O and, for a fixed seed and
queue, is deterministic.

Overlap: in the steady state (every request decoding, nothing queued) step() launches step N+1
before it reads step N's tokens, so the host prepares the next step while the device runs this
one; rows of N+1 take their input ids from N's device output. The tokens are the same as without
overlap. A request that N ends (EOS, stop string) wastes one step, whose token is dropped. With
structured requests in the batch, N+1's sampling waits for its masks, and they for N's tokens: N is
resolved inside N+1's launch, after N+1's forward is queued (`_bitmask`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from infer.engine.config import EngineConfig
from infer.engine.request import Request, RequestState, StepOutput
from infer.engine.scheduler import ScheduledBatch, Scheduler
from infer.kv.kv_manager import KVCacheManager
from infer.loader.detokenizer import IncrementalDetokenizer
from infer.loader.tokenizer import Tokenizer
from infer.runners.base import LaunchedStep, Runner
from infer.runners.step import StepInput, StepKind, StepResult
from infer.sampling.logprobs import TokenLogprob
from infer.sampling.params import SamplingParams
from infer.sampling.stop import StopChecker
from infer.structured.compiler import GrammarCompiler
from infer.structured.masks import BitmaskFiller, Grammar, advance, has_open


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for metrics: running requests, KV blocks, preemptions."""

    num_running: int
    kv_blocks_total: int
    kv_blocks_free: int
    num_preemptions: int


class Engine:
    def __init__(self, config: EngineConfig, runner: Runner, kv: KVCacheManager, tokenizer: Tokenizer) -> None:
        self.config = config
        self.runner = runner
        self.kv = kv
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(config, kv)
        self.grammars = GrammarCompiler(tokenizer, runner.vocab_size)
        self.masks = BitmaskFiller(config.max_batch_size, runner.vocab_size)
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._aborts: deque[str] = deque()  # appends and pops are atomic, so other threads may abort
        self._in_flight: tuple[ScheduledBatch, LaunchedStep] | None = None  # launched, tokens not read yet
        self._resolved_in_launch: list[StepOutput] = []  # outputs of the step resolved by `_bitmask`

    def validate_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise ValueError for a prompt the engine cannot run (checked before anything is queued)."""
        if not prompt_token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if len(prompt_token_ids) >= self.config.max_seq_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens; max_seq_len={self.config.max_seq_len} leaves no room to generate"
            )
        vocab = self.runner.vocab_size
        bad = next((t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})")

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Request:
        self.validate_prompt(prompt_token_ids)
        request_id = request_id or f"req-{next(self._ids)}"
        if self._find(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            seed=params.seed if params.seed is not None else self._rng.randrange(2**63),
            detokenizer=IncrementalDetokenizer(self.tokenizer, prompt_token_ids),
            stop_checker=StopChecker(params.stop),
            arrival_index=next(self._arrivals),
            grammar=Grammar(self.grammars.matcher(params.structured)) if params.structured is not None else None,
        )
        self.scheduler.add(request)
        return request

    def _find(self, request_id: str) -> list[Request]:
        return [r for r in (*self.scheduler.waiting, *self.scheduler.running) if r.request_id == request_id]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            kv_blocks_total=self.kv.allocator.num_blocks,
            kv_blocks_free=self.kv.num_free_blocks,
            num_preemptions=self.scheduler.num_preemptions,
        )

    def abort(self, request_id: str) -> None:
        """Ask for a request to end; the next step frees its blocks and emits its final output."""
        self._aborts.append(request_id)

    def step(self) -> list[StepOutput]:
        outputs = [] if self._may_overlap() else self._resolve()
        outputs += self.apply_aborts()
        batch = self.scheduler.schedule()
        if batch is None:
            if self._in_flight is not None:
                return outputs + self._resolve()
            if self.scheduler.waiting:  # kv_layout guarantees one max_seq_len request fits an idle cache
                raise RuntimeError(f"cannot admit {self.scheduler.waiting[0].request_id!r} into an idle KV cache")
            return outputs
        now = time.monotonic()
        for request in batch.requests:
            request.first_scheduled_time = request.first_scheduled_time or now
        try:
            launched = self.runner.launch(self._step_input(batch))
        except Exception as exc:  # the batch fails, the engine keeps serving everyone else
            outputs += self._take_resolved_in_launch() + self._resolve()
            return outputs + [self._fail(r, f"{type(exc).__name__}: {exc}") for r in batch.requests if not r.finished]
        for request in batch.requests:
            request.pending_tokens += 1
        outputs += self._take_resolved_in_launch() + self._resolve()
        self._in_flight = (batch, launched)
        return outputs

    def _may_overlap(self) -> bool:
        """Whether the next step may launch before the in-flight one is read: only a decode of the running
        requests that needs no host-side token history (no queue to admit, no abort, no repetition penalty)."""
        s = self.scheduler
        return not self._aborts and not s.waiting and not any(r.sampling_params.needs_history for r in s.running)

    def _resolve(self, on_advanced: Callable[[], None] | None = None) -> list[StepOutput]:
        """Read the in-flight step's tokens (the step boundary) and turn them into outputs. The grammars take
        their tokens first; `on_advanced` runs then, before the outputs are processed."""
        if self._in_flight is None:
            return []
        batch, launched = self._in_flight
        self._in_flight = None
        for request in batch.requests:
            request.pending_tokens -= 1
        try:
            result = launched.result()
        except Exception as exc:
            return [self._fail(r, f"{type(exc).__name__}: {exc}") for r in batch.requests if not r.finished]
        # a request ended while this step was in flight (stop found in the step before, abort) drops its token
        rows = [(i, r) for i, r in enumerate(batch.requests) if not r.finished]
        advance([(r.grammar, result.token_ids[i]) for i, r in rows if r.grammar and r.sampling_params.max_tokens])
        if on_advanced is not None:
            on_advanced()
        return [self._process(r, result, i) for i, r in rows]

    def _bitmask(self, batch: ScheduledBatch) -> torch.Tensor:
        """StepInput.token_bitmask, called inside the launch of `batch` once its forward is queued. With a step
        in flight (the overlap) the masks need its tokens: it is resolved here, its outputs kept for step(), and
        the masks are filled on the mask thread while this thread processes those outputs."""
        fills = []

        def start_fill() -> None:
            fills.append(self.masks.fill([None if r.finished else r.grammar for r in batch.requests]))

        if self._in_flight is not None:
            self._resolved_in_launch += self._resolve(on_advanced=start_fill)
        if not fills:  # nothing was in flight, or its result failed
            start_fill()
        return fills[0].result()

    def _take_resolved_in_launch(self) -> list[StepOutput]:
        outputs, self._resolved_in_launch = self._resolved_in_launch, []
        return outputs

    def fail_all(self, error: str) -> list[StepOutput]:
        """Fail every queued and running request (after an unexpected error outside the runner)."""
        return [self._fail(r, error) for r in [*self.scheduler.waiting, *self.scheduler.running]]

    def apply_aborts(self) -> list[StepOutput]:
        """End every request whose abort was asked for: free its blocks, return its final outputs."""
        outputs = []
        while self._aborts:
            for request in self._find(self._aborts.popleft()):
                self._retire(request, "abort")
                outputs.append(self._output(request, None, "", "abort"))
        return outputs

    def _step_input(self, batch: ScheduledBatch) -> StepInput:
        step = StepInput(batch.kind)
        if batch.kind is StepKind.DECODE:
            in_flight = {r.request_id: i for i, r in enumerate(self._in_flight[0].requests)} if self._in_flight else {}
            step.prev_rows = [in_flight[r.request_id] if r.pending_tokens else -1 for r in batch.requests]
        for r in batch.requests:
            if batch.kind is StepKind.PREFILL:  # a preempted request recomputes its outputs too
                start, new = 0, r.prompt_token_ids + r.output_token_ids
            else:  # the last token; 0 stands in for one still on the device (prev_rows says where)
                start, new = r.num_scheduled_tokens - 1, [r.output_token_ids[-1] if not r.pending_tokens else 0]
            step.token_ids.extend(new)
            step.positions.extend(range(start, start + len(new)))
            step.query_lens.append(len(new))
            step.context_lens.append(start + len(new))
            step.slot_mapping.extend(self.kv.slots(r.request_id, start, len(new)))
            step.block_tables.append(self.kv.block_table(r.request_id))
            step.sampling.append(r.sampling_params)
            step.seeds.append(r.seed)
            step.output_steps.append(len(r.output_token_ids) + r.pending_tokens)
            step.logprobs.append(r.sampling_params.logprobs)
            first_prefill = batch.kind is StepKind.PREFILL and r.num_preemptions == 0
            step.prompt_logprobs.append(r.sampling_params.prompt_logprobs if first_prefill else None)
        if any(r.sampling_params.needs_history for r in batch.requests):
            step.history = [r.prompt_token_ids + r.output_token_ids for r in batch.requests]
        if has_open([r.grammar for r in batch.requests]):
            step.token_bitmask = partial(self._bitmask, batch)
        return step

    # outputs ----------------------------------------------------------------------------------

    def _process(self, request: Request, result: StepResult, row: int) -> StepOutput:
        prompt_logprobs = result.prompt_logprobs[row] if result.prompt_logprobs else None
        params = request.sampling_params
        if params.max_tokens == 0:  # prompt scoring only (echo with logprobs): nothing is generated
            self._retire(request, "length")
            return self._output(request, None, "", "length", prompt_logprobs=prompt_logprobs)
        token = result.token_ids[row]
        request.output_token_ids.append(token)
        if request.grammar is not None and request.grammar.error is not None:
            error = f"the output constraint cannot be met with this model's tokenizer: {request.grammar.error}"
            return self._fail(request, error, client_error=True)
        if request.state is RequestState.PREFILL:  # not WAITING: a preempted request keeps waiting
            request.state = RequestState.DECODE
        is_eos = token in self.tokenizer.eos_token_ids and not params.ignore_eos
        text = request.text
        if not is_eos:
            request.detokenizer.push(token)
            text = request.detokenizer.text
        reason = self._finish_reason(request, is_eos)
        if reason is not None and not is_eos:
            request.detokenizer.flush()
            text = request.detokenizer.text
        stop_at = request.stop_checker.check(text)
        if stop_at is not None:
            text, reason = text[:stop_at], "stop"
        request.text = text
        visible = len(text) if reason else len(text) - request.stop_checker.holdback(text)
        delta = text[request.emitted_chars : max(visible, request.emitted_chars)]
        request.emitted_chars += len(delta)
        if reason is not None:
            self._retire(request, reason)
        logprob = result.logprobs[row] if result.logprobs else None
        return self._output(request, token, delta, reason, logprob=logprob, prompt_logprobs=prompt_logprobs)

    def _fail(self, request: Request, error: str, client_error: bool = False) -> StepOutput:
        self._retire(request, "error")
        request.state = RequestState.FAILED
        out = self._output(request, None, "", "error", error)
        out.client_error = client_error
        return out

    def _output(
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
        )

    def _finish_reason(self, request: Request, is_eos: bool) -> str | None:
        if is_eos or (request.grammar is not None and request.grammar.complete):  # the grammar has ended
            return "stop"
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
            return "length"
        if request.num_tokens >= self.config.max_seq_len:
            return "length"
        return None

    def _retire(self, request: Request, reason: str) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        self.scheduler.finish(request)
