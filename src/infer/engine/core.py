"""EngineCore.step_core(): resolve the step in flight, schedule, forward, grammar masks, sample, emit the outputs.

The scheduler (scheduler.py) decides what runs and owns every request's state and KV blocks; step_input.py packs
its batch for the runner; the
output processor (outputs.py) turns sampled ids into the step's CoreStep (plain tokens as columns,
CoreOutputs with finish reasons, logprobs, probe scores; never text); the overlap of steps (overlap.py)
is the one mechanism that lets step N+1 launch before step N is read. Aborts are queued (any thread may
call `abort`) and applied at the start of the next step. step_core() does no I/O and, for a fixed seed
and queue, is deterministic. The core runs in its own process under `infer serve` (build/core_main.py) and
in the caller's for offline use (build/in_process.py).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter, deque
from collections.abc import Callable

import numpy as np
import torch

from infer.engine.config import EngineConfig
from infer.engine.outputs import OutputProcessor
from infer.engine.overlap import InFlight
from infer.wire import CoreOutput, CoreStep, EngineStats, ProbeCatalog, check_probes, validate_prompt
from infer.lora.adapter import LoRAError
from infer.lora.registry import AdapterRef, LoRARegistry
from infer.engine.request import Request
from infer.engine.scheduler import ScheduledBatch, Scheduler
from infer.engine.step_input import step_input
from infer.kv.kv_manager import KVCacheManager
from infer.loader.tokenizer import Tokenizer
from infer.distributed.group import DistributedError
from infer.runners.base import Runner
from infer.sampling.params import SamplingParams
from infer.structured.compiler import GrammarCompiler
from infer.structured.masks import BitmaskFiller, Grammar, advance, has_open
from omniscience import ProbeLayout, ProbeSet


class EngineCore:
    """The scheduler and the runner: requests of token ids in, one output per request and token out (a CoreStep
    per step)."""

    def __init__(self, config: EngineConfig, runner: Runner, kv: KVCacheManager, tokenizer: Tokenizer,
                 loras: LoRARegistry | None = None) -> None:
        self.config = config
        self.loras = loras  # the registered LoRA adapters (with enable_lora)
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
        lora = self._adapter(params.lora)
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            seed=params.seed if params.seed is not None else self._rng.randrange(2**63),
            arrival_index=next(self._arrivals),
            grammar=Grammar(self.grammars.matcher(params.structured)) if params.structured is not None else None,
            probe_names=probe_names,
            lora=lora,
        )
        self.scheduler.add(request)
        return request

    def _adapter(self, name: str | None) -> AdapterRef | None:
        """The registered adapter a request names (LoRAError, a ValueError: unknown, or LoRA is off)."""
        return None if name is None else self._registry(f"lora={name!r}: ").get(name)

    def _registry(self, context: str = "") -> LoRARegistry:
        """The adapters' registry; LoRAError (after `context`) when the engine was built without LoRA."""
        if self.loras is None:
            raise LoRAError(f"{context}LoRA adapters are not enabled (start the engine with enable_lora=True, or "
                            "infer serve --enable-lora)")
        return self.loras

    def add_lora(self, name: str, path: str) -> AdapterRef:
        """Register a PEFT adapter under `name` (LoRAError naming what is wrong with it)."""
        return self._registry().add(name, path)

    def remove_lora(self, name: str) -> AdapterRef:
        """Unregister an adapter: later requests cannot name it; those already queued with it still run."""
        return self._registry().remove(name)

    def lora_adapters(self) -> list[AdapterRef]:
        return [] if self.loras is None else self.loras.adapters()

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
            lora_requests=self._lora_requests(),
        )

    def _lora_requests(self) -> tuple[tuple[str, int, int], ...]:
        """(adapter, running, waiting) of every adapter some request uses."""
        if self.loras is None:
            return ()
        running = Counter(r.lora.name for r in self.scheduler.running if r.lora is not None)
        waiting = Counter(r.lora.name for r in self.scheduler.waiting if r.lora is not None)
        return tuple((name, running[name], waiting[name]) for name in sorted(running | waiting))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Ask for a request to end (reason "stop": its text hit a stop string); the next step frees its blocks
        and emits its final output."""
        self._aborts.append((request_id, reason))

    def step_core(self) -> CoreStep:
        """One step, top to bottom: resolve the step in flight (unless this one may launch ahead of it), apply aborts,
        schedule, forward, the grammar masks, sample, then read the step before (the overlap: overlap.py). A runner
        that does not launch ahead (the CPU's) has its step read at once."""
        s = self.scheduler
        ahead = self.runner.launches_ahead and InFlight.may_launch_ahead(
            bool(self._aborts), s.needs_history, s.wants_pooling, s.proposer is not None)
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
            step = step_input(batch, self.scheduler, self._in_flight.prev_rows(batch), self.tokenizer.eos_token_ids,
                              drafter=self.config.speculative_method == "draft")
            forwarded = self.runner.forward(step)
            masks = self._masks(batch, outputs) if has_open([r.grammar for r in batch.requests]) else None
            launched = self.runner.sample(forwarded, masks)
        except DistributedError:  # a tensor-parallel rank is gone: no step can run, the caller ends the engine
            raise
        except Exception as exc:  # the batch fails, the engine keeps serving everyone else
            outputs += self._resolve()
            failed = [self.outputs.fail(r, f"{type(exc).__name__}: {exc}") for r in batch.requests if not r.finished]
            return self.outputs.take_step(outputs + failed)
        self.scheduler.launched(batch)
        outputs += self._resolve()
        self._in_flight.step = (batch, launched)
        if not self.runner.launches_ahead:  # its forward ran inside the calls: nothing to overlap, so its tokens go out
            outputs += self._resolve()      # now rather than after the next step's forward
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
        if result.pooled is not None:
            self.outputs.collect_pooled(batch.rows, result.pooled[first:])
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

    def _masks(self, batch: ScheduledBatch, outputs: list[CoreOutput]) -> torch.Tensor:
        """The [rows, ceil(vocab / 32)] bitmask of the tokens each row's grammar allows, made while the device runs
        the batch's forward. With a step in flight (the overlap) the grammars need its tokens: it is resolved here
        (its outputs appended to `outputs`), and the masks are filled on the mask thread while this thread processes
        those outputs."""
        fills = []

        def start_fill() -> None:
            grammars = [r.grammar if not r.finished else None for r in batch.requests[: batch.num_decode]]
            grammars += [r.request.grammar if r.samples and not r.request.finished else None for r in batch.rows]
            fills.append(self.masks.fill(grammars))

        if self._in_flight.step is not None:
            outputs += self._resolve(on_advanced=start_fill)
        if not fills:  # nothing was in flight, or its result failed
            start_fill()
        return fills[0].result()

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
