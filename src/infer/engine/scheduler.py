"""The scheduler: which requests run in the next step, admitting, preempting and retiring them.

A step is either a prefill (newly admitted requests, their whole prompt packed without padding)
or a decode (one token for every running request). The policy picks the kind of step, the
fairness rule bounds how long a decoding sequence can wait, and when the KV cache runs out of
blocks the most recently admitted request is preempted and later recomputed from its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from infer.engine.config import EngineConfig
from infer.engine.request import Request, RequestState
from infer.kv.kv_manager import KVCacheManager
from infer.runners.step import StepKind


@dataclass
class ScheduledBatch:
    kind: StepKind
    requests: list[Request]


class Scheduler:
    """Owns the waiting queue and the running set; all state changes happen inside schedule()/finish()."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: preemption takes from the end
        self.step_index = 0
        self.num_preemptions = 0
        self._last_kind: StepKind | None = None
        self._head_skips = 0  # times the head of the queue was overtaken (prefill_first)
        self._watermark = kv.allocator.num_blocks // 100  # free blocks kept back at admission

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step's batch, or None when there is nothing to run."""
        batch = self._pick()
        if batch is not None:
            self.step_index += 1
            self._last_kind = batch.kind
            for request in batch.requests:
                request.last_step = self.step_index
        return batch

    def finish(self, request: Request) -> None:
        """Drop a finished or aborted request from the queues and free its blocks."""
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request.request_id)

    # step kind --------------------------------------------------------------------------------

    def _pick(self) -> ScheduledBatch | None:
        if self.config.batching_mode == "static":
            return self._prefill() if not self.running else self._decode()
        if self.running and (self._overdue() or self._decode_turn()):
            return self._decode()
        return self._prefill() or self._decode()

    def _overdue(self) -> bool:
        """The fairness rule: some decoding sequence has waited fairness_steps steps."""
        next_step = self.step_index + 1
        return any(next_step - r.last_step >= self.config.fairness_steps for r in self.running)

    def _decode_turn(self) -> bool:
        return self.config.scheduler_policy == "decode_round_robin" and self._last_kind is StepKind.PREFILL

    # prefill ----------------------------------------------------------------------------------

    def _prefill(self) -> ScheduledBatch | None:
        admitted = self._admit()
        if not admitted:
            return None
        self.running.extend(admitted)
        return ScheduledBatch(StepKind.PREFILL, admitted)

    def _admit(self) -> list[Request]:
        """Admit waiting requests while batch size, token budget and free blocks allow."""
        admitted: list[Request] = []
        tokens = 0
        head = self.waiting[0] if self.waiting else None
        overtake = self.config.scheduler_policy == "prefill_first" and self._head_skips < self.config.fairness_steps
        for request in list(self.waiting):
            if len(self.running) + len(admitted) >= self.config.max_batch_size:
                break
            fits = tokens + request.num_tokens <= self.config.max_num_batched_tokens and self._reserve(request)
            if not fits:
                if not overtake:
                    break
                continue
            self.waiting.remove(request)
            request.state = RequestState.PREFILL
            admitted.append(request)
            tokens += request.num_tokens
        if head is not None and head not in self.waiting:
            self._head_skips = 0
        elif admitted:
            self._head_skips += 1  # the head was overtaken; after fairness_steps times it no longer is
        return admitted

    def _reserve(self, request: Request) -> bool:
        need = request.num_tokens
        if not self.kv.can_allocate(request.request_id, need):
            return False
        free_after = self.kv.num_free_blocks - self.kv.blocks_for(request.request_id, need)
        if free_after < self._watermark and self.running:
            return False
        self.kv.allocate(request.request_id, need)
        return True

    # decode -----------------------------------------------------------------------------------

    def _decode(self) -> ScheduledBatch | None:
        """Every running request gets a slot for its next token; preempt from the back when blocks run out.

        A request whose pending (not yet read) tokens already end it sits this step out.
        """
        batch: list[Request] = []
        for request in list(self.running):
            if request not in self.running or request.budget_reached(self.config.max_seq_len):
                continue  # preempted earlier in this loop, or finishing
            need = request.num_scheduled_tokens
            while not self.kv.can_allocate(request.request_id, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is request:
                    break
            else:
                self.kv.allocate(request.request_id, need)
                batch.append(request)
        return ScheduledBatch(StepKind.DECODE, batch) if batch else None

    def _preempt(self, request: Request) -> None:
        """Recompute later: free the blocks, keep the tokens, go back to the front of the queue."""
        self.running.remove(request)
        self.kv.free(request.request_id)
        request.state = RequestState.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
