"""EngineCore.step_core(): resolve the step in flight, schedule, launch, emit the core's outputs.

The scheduler (scheduler.py) decides what runs and owns every request's state and KV blocks; the
output processor (outputs.py) turns sampled ids into the step's CoreStep (plain tokens as columns,
CoreOutputs with finish reasons, logprobs, probe scores; never text); the overlap of steps (overlap.py)
is the one mechanism that lets step N+1 launch before step N is read. Aborts are queued (any thread may
call `abort`) and applied at the start of the next step. step_core() does no I/O and, for a fixed seed
and queue, is deterministic. The core runs in its own process under `infer serve` (core_process.py) and
in the caller's for offline use (engine.py).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from infer.engine.config import EngineConfig
from infer.engine.outputs import OutputProcessor
from infer.engine.overlap import InFlight
from infer.wire import CoreOutput, CoreStep, EngineStats, ProbeCatalog, check_probes, validate_prompt
from infer.engine.request import Request
from infer.engine.scheduler import ScheduledBatch, ScheduledRow, Scheduler
from infer.kv.kv_manager import KVCacheManager
from infer.loader.tokenizer import Tokenizer
from infer.distributed.group import DistributedError
from infer.runners.base import Runner
from infer.runners.step import StepInput, StepKind
from infer.sampling.params import SamplingParams
from infer.sampling.slots import SlotState
from infer.structured.compiler import GrammarCompiler
from infer.structured.masks import BitmaskFiller, Grammar, advance, has_open
from omniscience import ProbeLayout, ProbeSet


class EngineCore:
    """The scheduler and the runner: requests of token ids in, one output per request and token out (a CoreStep
    per step)."""

    def __init__(self, config: EngineConfig, runner: Runner, kv: KVCacheManager, tokenizer: Tokenizer) -> None:
        self.config = config
        self.runner = runner
        self.kv = kv
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(config, kv)
        self.outputs = OutputProcessor(tokenizer.eos_token_ids, self.scheduler, config.max_seq_len)
        self.grammars = GrammarCompiler(tokenizer, runner.vocab_size)
        self.masks = BitmaskFiller(config.max_batch_size, runner.vocab_size)
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._aborts: deque[tuple[str, str]] = deque()  # appends and pops are atomic, so other threads may abort
        self._in_flight = InFlight()
        self._resolved_in_launch: list[CoreOutput] = []  # outputs of the step resolved by `_bitmask`
        self._catalog: tuple[ProbeLayout | None, ProbeCatalog | None] | None = None

    def validate_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise ValueError for a prompt the engine cannot run (checked before anything is queued)."""
        validate_prompt(prompt_token_ids, self.config.max_seq_len, self.runner.vocab_size)

    @property
    def probe_layout(self) -> ProbeLayout | None:
        """The loaded probe set (names, layers, columns, version), or None when the engine has none."""
        return self.runner.probes.layout if self.runner.probes is not None else None

    @property
    def probe_catalog(self) -> ProbeCatalog | None:
        """The loaded probe set as requests name it (no weights: what the API servers are told)."""
        layout = self.probe_layout
        if self._catalog is None or self._catalog[0] is not layout:
            self._catalog = (layout, ProbeCatalog.of(layout))
        return self._catalog[1]

    def check_probes(self, params: SamplingParams) -> tuple[str, ...]:
        """The probe names a request's outputs will carry; ValueError (naming the field) for ones not loaded."""
        return check_probes(params, self.probe_catalog)

    def swap_probes(self, probe_set: ProbeSet) -> ProbeLayout:
        """Write a new probe set's weights into the runner's probe buffers (call between steps: the steps already
        launched keep the old scores, every later one reads the new). Raises ProbeError if it does not fit."""
        if self.runner.probes is None:
            raise ValueError("probes: no probe set is loaded, so there is nothing to reload")
        return self.runner.probes.load(probe_set)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Request:
        self.validate_prompt(prompt_token_ids)
        probe_names = self.outputs.shared_names(self.check_probes(params))
        request_id = request_id or f"req-{next(self._ids)}"
        if self._find(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            seed=params.seed if params.seed is not None else self._rng.randrange(2**63),
            arrival_index=next(self._arrivals),
            grammar=Grammar(self.grammars.matcher(params.structured)) if params.structured is not None else None,
            probe_names=probe_names,
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
            prefix_cache_queries=self.kv.prefix_queries,
            prefix_cache_hits=self.kv.prefix_hits,
            spec_drafted=self.scheduler.num_drafted,
            spec_accepted=self.scheduler.num_accepted,
            spec_verified_rows=self.scheduler.num_verified_rows,
        )

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Ask for a request to end (reason "stop": its text hit a stop string); the next step frees its blocks
        and emits its final output."""
        self._aborts.append((request_id, reason))

    def step_core(self) -> CoreStep:
        ahead = InFlight.may_launch_ahead(bool(self._aborts), self.scheduler.needs_history, self.scheduler.proposer is not None)
        outputs = [] if ahead else self._resolve()
        outputs += self.apply_aborts()
        batch = self.scheduler.schedule()
        if batch is None:
            was_in_flight = self._in_flight.step is not None  # a preempted request may wait for its token
            outputs += self._resolve()
            if not was_in_flight and not self.scheduler.running and self.scheduler.waiting:  # kv_layout sized
                raise RuntimeError(f"cannot admit {self.scheduler.waiting[0].request_id!r} into an idle KV cache")
            return self.outputs.take_step(outputs)
        now = time.monotonic()
        for request in batch.requests:
            request.first_scheduled_time = request.first_scheduled_time or now
        try:
            launched = self.runner.launch(self._step_input(batch))
        except DistributedError:  # a tensor-parallel rank is gone: no step can run, the caller ends the engine
            raise
        except Exception as exc:  # the batch fails, the engine keeps serving everyone else
            outputs += self._take_resolved_in_launch() + self._resolve()
            failed = [self.outputs.fail(r, f"{type(exc).__name__}: {exc}") for r in batch.requests if not r.finished]
            return self.outputs.take_step(outputs + failed)
        self.scheduler.launched(batch)
        outputs += self._take_resolved_in_launch() + self._resolve()
        self._in_flight.step = (batch, launched)
        return self.outputs.take_step(outputs)

    def _resolve(self, on_advanced: Callable[[], None] | None = None) -> list[CoreOutput]:
        """Read the in-flight step's tokens (the step boundary) and turn them into outputs. The grammars take
        their tokens first; `on_advanced` runs then, before the outputs are processed."""
        step = self._in_flight.take()
        if step is None:
            return []
        batch, launched = step
        self.scheduler.resolved(batch)
        try:
            result = launched.result()
        except Exception as exc:
            return [self.outputs.fail(r, f"{type(exc).__name__}: {exc}") for r in batch.requests if not r.finished]
        first = batch.num_decode  # the decode table's rows come first, then batch.rows
        if result.prompt_probe_scores is not None:
            self.outputs.collect_prompt_probes(batch.rows, result.probe_layout, result.prompt_probe_scores[first:])
        if result.prompt_logprobs:
            self.outputs.collect_prompt_logprobs(batch.rows, result.prompt_logprobs[first:])
        # a request ended while this step was in flight (stop found in the step before, abort) drops its token
        rows = [(first + i, row.request) for i, row in enumerate(batch.rows) if row.samples and not row.request.finished]
        d = batch.decode  # its rows are checked as arrays (process_decode); of them only a non-plain one has a grammar
        not_plain = [] if d is None else [(i, d.requests[i]) for i in np.flatnonzero(~d.plain).tolist()]
        advance([(r.grammar, result.token_ids[i]) for i, r in not_plain + rows
                 if r.grammar and r.sampling_params.max_tokens and not r.finished])
        if on_advanced is not None:
            on_advanced()
        if result.extra_tokens is not None:  # speculation: roll back what was not accepted before the outputs end anyone
            for i, r in rows:
                if batch.rows[i - first].drafts:
                    self.scheduler.speculated(batch.rows[i - first], 1 + len(result.extra_tokens[i]))
        outputs = self.outputs.process_decode(d, result) if d is not None else []
        return outputs + [out for i, r in rows for out in self.outputs.process(r, result, i)]

    def _bitmask(self, batch: ScheduledBatch) -> torch.Tensor:
        """StepInput.token_bitmask, called inside the launch of `batch` once its forward is queued. With a step
        in flight (the overlap) the masks need its tokens: it is resolved here, its outputs kept for step_core(), and
        the masks are filled on the mask thread while this thread processes those outputs."""
        fills = []

        def start_fill() -> None:
            grammars = [r.grammar if not r.finished else None for r in batch.requests[: batch.num_decode]]
            grammars += [r.request.grammar if r.samples and not r.request.finished else None for r in batch.rows]
            fills.append(self.masks.fill(grammars))

        if self._in_flight.step is not None:
            self._resolved_in_launch += self._resolve(on_advanced=start_fill)
        if not fills:  # nothing was in flight, or its result failed
            start_fill()
        return fills[0].result()

    def _take_resolved_in_launch(self) -> list[CoreOutput]:
        outputs, self._resolved_in_launch = self._resolved_in_launch, []
        return outputs

    def fail_all(self, error: str) -> list[CoreOutput]:
        """Fail every queued and running request (after an unexpected error outside the runner)."""
        return [self.outputs.fail(r, error) for r in [*self.scheduler.waiting, *self.scheduler.running]]

    def apply_aborts(self) -> list[CoreOutput]:
        """End every request whose abort was asked for: free its blocks, return its final outputs."""
        outputs = []
        while self._aborts:
            request_id, reason = self._aborts.popleft()
            outputs += [self.outputs.abort(r, reason) for r in self._find(request_id)]
        return outputs

    def _step_input(self, batch: ScheduledBatch) -> StepInput:
        """The runner's step descriptor: the decode table's rows (arrays), then the scheduler's other rows, their
        sampling slots and the sampling state of requests that joined (one pass per field: this runs every step)."""
        rows, requests, d = batch.rows, batch.requests, batch.decode
        step = StepInput(StepKind.DECODE if batch.is_decode else StepKind.PREFILL)
        step.prev_rows = self._in_flight.prev_rows(batch)
        if d is not None:  # read off the table: no loop over the requests but for their last token ids
            step.token_ids = [r.token_ids[-1] for r in d.requests]  # a pending token's row takes it on the device
            step.positions, step.slot_mapping, step.context_lens = d.positions, d.slot_mapping, d.context_lens
            step.block_tables, step.sampling_slots = d.block_tables, d.sampling_slots
            step.query_lens = [1] * len(d.requests)
        if rows:
            self._add_rows(step, batch)
        step.joined = [self._slot_state(r) for r in batch.joined]
        step.probes = self.scheduler.wants_probes
        if self.scheduler.wants_logprobs:
            step.logprobs = [r.sampling_params.logprobs for r in requests[: batch.num_decode]]
            step.logprobs += [r.request.sampling_params.logprobs if r.samples else None for r in rows]
        if self.scheduler.needs_history:
            step.history = [r.token_ids for r in requests]
        if has_open([r.grammar for r in requests]):
            step.token_bitmask = partial(self._bitmask, batch)
        return step

    def _add_rows(self, step: StepInput, batch: ScheduledBatch) -> None:
        """Pack the batch's rows (prefill chunks, or decodes with drafts) after the decode table's rows."""
        rows, n = batch.rows, batch.num_decode
        if batch.is_decode and not batch.has_drafts:
            token_ids = [r.request.tokens_at(r.start, 1)[0] for r in rows]
        else:
            token_ids: list[int] = []
            for r in rows:  # whole slices: no loop over a chunk's tokens
                token_ids += r.request.tokens_at(r.start, r.num_new - len(r.drafts))
                token_ids += r.drafts
            if batch.has_drafts:
                step.drafts = [r.drafts for r in rows]
                if self.config.speculative_method == "draft":
                    step.drafter_tokens = [r.request.token_ids[r.request.num_drafter_tokens : r.start + 1] if r.drafts
                                           else [] for r in rows]
        if not batch.is_decode:
            step.prompt_logprobs = [None] * n + [r.prompt_logprobs for r in rows]
            if any(r.prompt_logprobs is not None for r in rows):
                step.prompt_next = [-1] * n + [_prompt_next(r) for r in rows]
            if self.scheduler.wants_probes:
                step.probe_prompt = [0] * n + [_prompt_rows(r) for r in rows]
        samples = [r.samples for r in rows]  # a chunk short of its prompt's end samples a token nobody keeps
        step.samples = None if all(samples) else [True] * n + samples
        step.token_ids = step.token_ids + token_ids
        # per token, as arrays: a prompt chunk's thousand positions cost no Python loop
        step.positions = np.concatenate([np.asarray(step.positions, dtype=np.int64),
                                         *(np.arange(r.start, r.start + r.num_new) for r in rows)])
        step.slot_mapping = np.concatenate([np.asarray(step.slot_mapping, dtype=np.int64), *(r.slots for r in rows)])
        step.query_lens = step.query_lens + [r.num_new for r in rows]
        step.context_lens = _listed(step.context_lens) + [r.start + r.num_new for r in rows]
        step.sampling_slots = _listed(step.sampling_slots) + [r.request.sampling_slot for r in rows]
        tables = [r.block_table for r in rows]
        if n:  # one padded array: the table's rows, then these
            width = max(step.block_tables.shape[1], max(map(len, tables)))
            padded = np.zeros((n + len(rows), width), dtype=np.int32)
            padded[:n, : step.block_tables.shape[1]] = step.block_tables
            for i, table in enumerate(tables):
                padded[n + i, : len(table)] = table
            step.block_tables = padded
        else:
            step.block_tables = tables

    def _slot_state(self, request: Request) -> SlotState:
        """What the runner writes into a joining request's sampling slot (its generated tokens only when a
        penalty counts them, the end-of-sequence ids only while min_tokens holds them back)."""
        p = request.sampling_params
        return SlotState(request.sampling_slot, p, request.seed, len(request.output_token_ids),
                         tuple(request.output_token_ids) if p.counts_output else (),
                         tuple(sorted(self.tokenizer.eos_token_ids)) if p.min_tokens and not p.ignore_eos else ())


def _listed(values: list[int] | np.ndarray) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else values


def _prompt_next(row: ScheduledRow) -> int:
    """The prompt token after a row's chunk, the target of its last position's prompt logprob; -1 at the prompt's end."""
    end, prompt = row.start + row.num_new, row.request.prompt_token_ids
    return prompt[end] if row.prompt_logprobs is not None and end < len(prompt) else -1


def _prompt_rows(row: ScheduledRow) -> int:
    """How many of the row's new positions are prompt positions whose scores its request still needs."""
    request = row.request
    if not request.needs_prompt_probes:
        return 0
    return max(0, min(row.start + row.num_new, len(request.prompt_token_ids)) - row.start)
