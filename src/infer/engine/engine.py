"""Engine.step(): schedule one batch, run it, turn sampled ids into detokenized, stop-checked outputs.

This is the foundation's static-admission engine: a prompt is admitted when its whole budget
(prompt + max_tokens, capped at max_seq_len) fits in free KV blocks, so decode never runs out of
blocks; waiting prompts are prefilled first, then every running request decodes one token.
Aborts are queued (any thread may call `abort`) and applied at the start of the next step.
"""

from __future__ import annotations

import itertools
import random
from collections import deque

from infer.engine.config import EngineConfig
from infer.engine.request import Request, RequestState, StepOutput
from infer.kv.kv_manager import KVCacheManager
from infer.loader.detokenizer import IncrementalDetokenizer
from infer.loader.tokenizer import Tokenizer
from infer.runners.step import StepInput, StepKind
from infer.runners.base import Runner
from infer.sampling.params import SamplingParams
from infer.sampling.stop import StopChecker


class Engine:
    def __init__(self, config: EngineConfig, runner: Runner, kv: KVCacheManager, tokenizer: Tokenizer) -> None:
        self.config = config
        self.runner = runner
        self.kv = kv
        self.tokenizer = tokenizer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._aborts: deque[str] = deque()  # appends and pops are atomic, so other threads may abort

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
        if any(r.request_id == request_id for r in (*self.waiting, *self.running)):
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            seed=params.seed if params.seed is not None else self._rng.randrange(2**63),
            detokenizer=IncrementalDetokenizer(self.tokenizer, prompt_token_ids),
            stop_checker=StopChecker(params.stop),
        )
        self.waiting.append(request)
        return request

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> None:
        """Ask for a request to end; the next step frees its blocks and emits its final output."""
        self._aborts.append(request_id)

    def step(self) -> list[StepOutput]:
        outputs = self.apply_aborts()
        batch, step = self._schedule()
        if not batch:
            if self.waiting:  # kv_layout guarantees one max_seq_len request fits an idle cache
                raise RuntimeError(f"cannot admit {self.waiting[0].request_id!r} into an idle KV cache")
            return outputs
        try:
            result = self.runner.execute(step)
        except Exception as exc:  # the batch fails, the engine keeps serving everyone else
            return outputs + [self._fail(request, f"{type(exc).__name__}: {exc}") for request in batch]
        return outputs + [self._process(request, token) for request, token in zip(batch, result.token_ids)]

    def apply_aborts(self) -> list[StepOutput]:
        """End every request whose abort was asked for: free its blocks, return its final outputs."""
        outputs = []
        while self._aborts:
            request_id = self._aborts.popleft()
            for request in [r for r in (*self.waiting, *self.running) if r.request_id == request_id]:
                if request in self.waiting:
                    self.waiting.remove(request)
                else:
                    self._retire(request, "abort")
                request.state, request.finish_reason = RequestState.FINISHED, "abort"
                outputs.append(self._output(request, None, "", "abort"))
        return outputs

    # scheduling -------------------------------------------------------------------------------

    def _budget(self, request: Request) -> int:
        return min(request.max_total_tokens, self.config.max_seq_len)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.config.max_batch_size:
            request = self.waiting[0]
            prompt_len = len(request.prompt_token_ids)
            if tokens + prompt_len > self.config.max_num_batched_tokens:
                break
            if not self.kv.can_allocate(request.request_id, self._budget(request)):
                break
            self.kv.allocate(request.request_id, self._budget(request))
            request.state = RequestState.PREFILL
            admitted.append(self.waiting.popleft())
            tokens += prompt_len
        return admitted

    def _schedule(self) -> tuple[list[Request], StepInput]:
        admitted = self._admit()
        if admitted:
            self.running.extend(admitted)
            return admitted, self._step_input(StepKind.PREFILL, admitted)
        return list(self.running), self._step_input(StepKind.DECODE, self.running)

    def _step_input(self, kind: StepKind, batch: list[Request]) -> StepInput:
        step = StepInput(kind)
        for r in batch:
            start = 0 if kind is StepKind.PREFILL else r.num_tokens - 1
            new = r.prompt_token_ids if kind is StepKind.PREFILL else r.output_token_ids[-1:]
            step.token_ids.extend(new)
            step.positions.extend(range(start, start + len(new)))
            step.query_lens.append(len(new))
            step.context_lens.append(start + len(new))
            step.slot_mapping.extend(self.kv.slots(r.request_id, start, len(new)))
            step.block_tables.append(self.kv.block_table(r.request_id))
            step.sampling.append(r.sampling_params)
            step.seeds.append(r.seed)
            step.output_steps.append(len(r.output_token_ids))
        if any(r.sampling_params.repetition_penalty != 1.0 for r in batch):
            step.history = [r.prompt_token_ids + r.output_token_ids for r in batch]
        return step

    # outputs ----------------------------------------------------------------------------------

    def _process(self, request: Request, token: int) -> StepOutput:
        request.output_token_ids.append(token)
        request.state = RequestState.DECODE
        params = request.sampling_params
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
        return self._output(request, token, delta, reason)

    def _fail(self, request: Request, error: str) -> StepOutput:
        self._retire(request, "error")
        request.state = RequestState.FAILED
        return self._output(request, None, "", "error", error)

    def _output(
        self, request: Request, token: int | None, delta: str, reason: str | None, error: str | None = None
    ) -> StepOutput:
        """One step's output for a request; finished once there is a finish reason."""
        return StepOutput(
            request_id=request.request_id,
            token_id=token,
            text_delta=delta,
            finished=reason is not None,
            finish_reason=reason,
            error=error,
            prompt_tokens=len(request.prompt_token_ids),
            completion_tokens=len(request.output_token_ids),
        )

    def _finish_reason(self, request: Request, is_eos: bool) -> str | None:
        if is_eos:
            return "stop"
        if len(request.output_token_ids) >= request.sampling_params.max_tokens:
            return "length"
        if request.num_tokens >= self.config.max_seq_len:
            return "length"
        return None

    def _retire(self, request: Request, reason: str) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        self.running.remove(request)
        self.kv.free(request.request_id)
