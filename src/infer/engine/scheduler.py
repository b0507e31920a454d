"""The scheduler: which requests run in the next step and how many tokens each, and every state change.

A step is a list of rows (request, new tokens) within `max_num_batched_tokens`. With chunked prefill
(continuous batching) every step carries each running decode first, then prefill chunks of at most
`prefill_chunk_size` tokens fill what is left of the budget: a long prompt runs over many steps
beside the decodes instead of stalling them. Without it a step is either whole prompts or decodes.
Which prompt work runs when decodes also wait is the policy's (policy.py). When the KV cache runs out of blocks (cached prefixes are evicted first) the
most recently admitted request is preempted and later recomputed from its tokens. The decoding
requests' rows live in persistent arrays (decode_table.py): a decode step reads them off with vector
operations, and only the few requests that need a new block go through Python. The scheduler is the
only owner of `Request.state`, of the decode table and of the KV manager's accounting (docs/engine.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from infer.engine.config import EngineConfig
from infer.engine.decode_table import DecodeRows, DecodeTable
from infer.engine.policy import POLICIES
from infer.engine.request import Request, RequestState
from infer.kv.kv_manager import KVCacheManager, blocks_needed
from infer.lora.registry import AdapterSlots, LoRALoad
from infer.speculative import DraftModelProposer, NgramProposer


class ScheduledRow(NamedTuple):  # a tuple: built for every request in every step, so it must be cheap
    """One request's part of a step: positions [start, start + num_new) computed, slots where their KV goes."""

    request: Request
    start: int
    num_new: int
    slots: np.ndarray  # int64 [num_new]
    block_table: list[int]
    samples: bool  # the row reaches the request's last known token: its sampled token is kept
    prompt_logprobs: int | None = None  # top-k for the logprobs of the prompt tokens after each of its positions
    drafts: tuple[int, ...] = ()  # speculation: proposed tokens after the last known one, its last num_new - 1 inputs
    pooling: str | None = None  # an embedding request's pooling: its chunks' final hidden states are read back


@dataclass
class ScheduledBatch:
    """A step: the decode table's rows first (`decode`), then `rows` (prefill chunks, or decodes with drafts)."""

    rows: list[ScheduledRow]
    joined: list[Request] = field(default_factory=list)  # requests that took a sampling slot for this step
    decode: DecodeRows | None = None
    lora_loads: list[LoRALoad] = field(default_factory=list)  # adapters the runner puts into slots before the step
    requests: list[Request] = field(init=False)  # every row's request, in step order
    # one known token per row (and its drafts): the decode fast path (fixed buffers, graphs)
    is_decode: bool = field(init=False)
    has_drafts: bool = field(init=False)

    def __post_init__(self) -> None:
        decoding = self.decode.requests if self.decode is not None else []
        self.requests = decoding + [row.request for row in self.rows]
        self.has_drafts = any(row.drafts for row in self.rows)
        # a one-token prompt chunk that asks for prompt logprobs needs the prefill path's hidden states
        self.is_decode = all(row.num_new == 1 + len(row.drafts) and row.prompt_logprobs is None and row.pooling is None
                             for row in self.rows)

    @property
    def num_decode(self) -> int:
        """Rows read off the decode table (they come first)."""
        return len(self.decode.requests) if self.decode is not None else 0


class Scheduler:
    """Owns the waiting queue and the running set; all state changes happen inside its methods."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        k = config.speculative_tokens
        self.proposer: NgramProposer | DraftModelProposer | None = None
        if config.speculative_method == "ngram":
            self.proposer = NgramProposer(k, config.prompt_lookup_min, config.prompt_lookup_max)
        elif config.speculative_method == "draft":
            self.proposer = DraftModelProposer(k)
        self.num_drafted = 0  # draft tokens verified
        self.num_accepted = 0  # of which accepted
        self.num_verified_rows = 0  # rows (request-steps) that verified drafts
        self.waiting: deque[Request] = deque()
        # speculation drafts per request, so its decodes are rows of their own; otherwise the table holds them
        self.table = None if self.proposer is not None else DecodeTable(
            config.max_batch_size, blocks_needed(config.max_seq_len, kv.block_size), kv.block_size, config.max_seq_len)
        self.running: list[Request] = []  # in admission order: preemption takes from the end
        self.step_index = 0
        self.num_preemptions = 0
        self._chunked = config.use_chunked_prefill
        self.policy = POLICIES[config.scheduler_policy](config.fairness_steps)
        self._last_had_prefill = False
        self._head_skips = 0  # times the head of the queue was overtaken (prefill_first)
        self._watermark = kv.allocator.num_blocks // 100  # free blocks kept back at admission
        self._caching = kv.prefix is not None
        self._free_slots = list(range(config.max_batch_size - 1, -1, -1))  # sampling slots (runner state)
        self.adapters = AdapterSlots(config.max_loras) if config.enable_lora else None  # LoRA device slots
        self._joined: list[Request] = []
        self._with_history = 0  # running requests whose sampling needs all their tokens (repetition penalty)
        self._with_logprobs = 0  # running requests that ask for logprobs
        self._with_probes = 0  # running requests whose outputs carry probe scores (or stop on one)
        self._with_pooling = 0  # running embedding requests

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def needs_history(self) -> bool:
        """Some running request's sampling reads every token it has (a repetition penalty)."""
        return self._with_history > 0

    @property
    def wants_logprobs(self) -> bool:
        return self._with_logprobs > 0

    @property
    def wants_probes(self) -> bool:
        return self._with_probes > 0

    @property
    def wants_pooling(self) -> bool:
        """Some running request embeds its prompt: its chunks' hidden states come back, each step read before the
        next is built (a recomputed chunk then knows which positions are already pooled)."""
        return self._with_pooling > 0

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step's rows, or None when there is nothing to run."""
        decode, rows = self._pick()
        if decode is None and not rows:
            return None
        self.step_index += 1
        self._last_had_prefill = any(r.request.state is RequestState.PREFILL for r in rows)
        batch = ScheduledBatch(rows, self._joined, decode,
                               self.adapters.take_loads() if self.adapters is not None else [])
        for request in batch.requests:
            request.last_step = self.step_index
        self._joined = []
        return batch

    def launched(self, batch: ScheduledBatch) -> None:
        """The batch is queued on the device: its positions count as computed, sampling rows owe a token,
        a request whose prompt is now computed decodes (it joins the decode table), and its full blocks join the
        prefix cache."""
        if batch.decode is not None:
            self._launched_decodes(batch.decode)
        for row in batch.rows:
            request = row.request
            request.num_computed_tokens = row.start + row.num_new
            if row.samples:
                request.pending_tokens += 1
                if request.state is RequestState.PREFILL:
                    request.state = RequestState.DECODE
                    if self.table is not None and not request.finished:
                        self.table.join(request, self.kv.block_table(request.request_id))
            self._publish(request)

    def _launched_decodes(self, rows: DecodeRows) -> None:
        assert self.table is not None
        self.table.advanced(rows)
        for request in rows.requests:
            request.num_computed_tokens += 1
            request.pending_tokens += 1
        if self._caching:  # a block fills when the known tokens (the last may be pending) reach its end
            bs = self.kv.block_size
            for i in ((rows.positions + 1) % bs <= 1).nonzero()[0]:
                self._publish(rows.requests[i])

    def _publish(self, request: Request) -> None:
        """Cache the request's newly full blocks of known tokens."""
        if self._caching and not request.finished:  # (structured output may finish it during the launch)
            known = min(request.num_computed_tokens, request.num_tokens)  # a pending token is not known yet
            if self.kv.publishable(request.request_id, known):
                self.kv.publish(request.request_id, request.token_ids, known)

    def speculated(self, row: ScheduledRow, emitted: int) -> None:
        """A row with drafts was read: `emitted` tokens came out (accepted drafts + the target's own). The
        positions past the accepted ones are rolled back and their blocks freed (never published: the prefix
        cache only takes blocks of known tokens)."""
        request = row.request
        request.num_computed_tokens = row.start + emitted  # the input token and the accepted drafts
        # a drafter fed the input token and all drafts but the last: with every draft accepted it lacks the last one
        request.num_drafter_tokens = request.num_computed_tokens - (emitted - 1 == len(row.drafts))
        self.kv.shrink(request.request_id, request.num_computed_tokens)
        request.num_drafted += len(row.drafts)
        request.num_accepted += emitted - 1
        self.num_drafted += len(row.drafts)
        self.num_accepted += emitted - 1
        self.num_verified_rows += 1

    def resolved(self, batch: ScheduledBatch) -> None:
        """The batch's sampled tokens have been read (appended to their requests' outputs, or dropped)."""
        for request in batch.requests[: batch.num_decode]:
            request.pending_tokens -= 1
        for row in batch.rows:
            if row.samples:
                row.request.pending_tokens -= 1

    def finish(self, request: Request, reason: str, failed: bool = False) -> None:
        """End a request: out of the queues, its blocks freed, its final state set."""
        request.state = RequestState.FAILED if failed else RequestState.FINISHED
        request.finish_reason = reason
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self._leave(request)
        self.kv.free(request.request_id)

    # what runs -------------------------------------------------------------------------------

    def _pick(self) -> tuple[DecodeRows | None, list[ScheduledRow]]:
        if self.config.batching_mode == "static":
            return (None, self._admit(self.config.max_num_batched_tokens)) if not self.running else self._decodes()
        if self._chunked:
            decode, rows = self._decodes()
            decoding = decode.requests if decode is not None else []
            if (decoding or rows) and not self.policy.prefills(self._last_had_prefill):
                return decode, rows
            budget = self.config.max_num_batched_tokens - len(decoding) - sum(r.num_new for r in rows)
            return decode, rows + self._chunks(decoding + [r.request for r in rows], budget)
        if self.running and (self._overdue() or not self.policy.prefills(self._last_had_prefill)):
            return self._decodes()
        admitted = self._admit(self.config.max_num_batched_tokens)
        return (None, admitted) if admitted else self._decodes()

    def _overdue(self) -> bool:
        """The fairness rule: some decoding sequence has waited fairness_steps steps."""
        next_step = self.step_index + 1
        return any(next_step - r.last_step >= self.config.fairness_steps for r in self.running)

    def _decodes(self) -> tuple[DecodeRows | None, list[ScheduledRow]]:
        """A row for every decoding request's next token; preempt from the back when blocks run out.

        A request whose pending (not yet read) tokens already end it sits this step out. The decode table gives
        the rows; only a request short of a block is looked at one by one. With speculation each request's
        drafts make its row, one request at a time.
        """
        if self.table is None:
            return None, self._drafted_decodes()
        granted: list[Request] = []
        waits: set[int] = set()
        for request in self.table.short_of_blocks():
            if request not in self.table:
                continue  # preempted earlier in this loop
            if self._grow(request, request.num_scheduled_tokens, granted):
                self.table.set_blocks(request, self.kv.block_table(request.request_id))
                granted.append(request)
            elif request in self.table:  # no block for it and nobody left to preempt: it waits a step
                waits.add(id(request))
        rows = self.table.rows(waits)
        return (rows if rows.requests else None), []

    def _drafted_decodes(self) -> list[ScheduledRow]:
        rows: list[ScheduledRow] = []
        for request in list(self.running):
            if request.state is not RequestState.DECODE:
                continue  # still prefilling, or preempted earlier in this loop (waiting again)
            if request.budget_reached(self.config.max_seq_len):
                continue
            drafts = self._drafts(request)
            if self._grow(request, request.num_scheduled_tokens + len(drafts), [r.request for r in rows]):
                rows.append(self._row(request, 1 + len(drafts), drafts=drafts))
        return rows

    def _drafts(self, request: Request) -> tuple[int, ...]:
        """Speculation: tokens proposed to follow the request's last one, as many as its limits and the free
        blocks allow (none for requests whose features verify per token only: docs/speculative.md)."""
        if self.proposer is None or request.pending_tokens or not request.may_speculate:
            return ()
        limit = min(request.sampling_params.max_tokens - len(request.output_token_ids),
                    self.config.max_seq_len - request.num_tokens) - 1
        drafts = self.proposer.propose(request.token_ids, limit)
        if drafts and not self.kv.can_allocate(request.request_id, request.num_tokens + len(drafts)):
            return ()  # drafts never preempt anyone
        return tuple(drafts)

    def _chunks(self, decoding: list[Request], budget: int) -> list[ScheduledRow]:
        """Prefill chunks: requests part-way through their prompt first, then admissions, within the budget."""
        rows: list[ScheduledRow] = []
        limit = self.config.max_prefill_chunks_per_step or self.config.max_batch_size
        for request in list(self.running):
            if budget <= 0 or len(rows) >= limit:
                return rows
            if request.state is RequestState.PREFILL:  # not preempted earlier in this loop
                n = min(request.num_uncomputed, self.config.prefill_chunk_size, budget)
                if self._grow(request, request.num_computed_tokens + n, decoding + [r.request for r in rows]):
                    rows.append(self._row(request, n))
                    budget -= n
        return rows + self._admit(budget, limit - len(rows))

    # admission ---------------------------------------------------------------------------------

    def _admit(self, budget: int, max_rows: int | None = None) -> list[ScheduledRow]:
        """Admit waiting requests while batch size, token budget and free blocks allow."""
        rows: list[ScheduledRow] = []
        head = self.waiting[0] if self.waiting else None
        overtake = self.policy.overtakes(self._head_skips)
        for request in list(self.waiting):
            if len(self.running) >= self.config.max_batch_size or budget <= 0 or len(rows) == (max_rows or -1):
                break
            row = self._try_admit(request, budget)
            if row is None:
                if not overtake:
                    break
                continue
            rows.append(row)
            budget -= row.num_new
        if head is not None and head not in self.waiting:
            self._head_skips = 0
        elif rows:
            self._head_skips += 1  # the head was overtaken; after fairness_steps times it no longer is
        return rows

    def _try_admit(self, request: Request, budget: int) -> ScheduledRow | None:
        """Reserve blocks for the request's first chunk (after its cached prefix) and move it to running."""
        if request.pending_tokens:  # preempted with a token still on the device: admit once it is read
            return None
        # a full hit still computes the last token (its logits); prompt logprobs and probes need every position computed
        lookup = not request.needs_prompt_logprobs and not request.needs_prompt_probes and not request.pools_every_position
        namespace = request.lora.adapter_id if request.lora is not None else 0  # an adapter's KV is its own
        cached = self.kv.admit(request.request_id, request.token_ids, request.num_tokens - 1, namespace) if lookup else 0
        if self._caching and lookup and self._prefix_in_progress(request, cached):
            self.kv.free(request.request_id)
            return None
        n = request.num_tokens - cached
        if self._chunked:
            n = min(n, self.config.prefill_chunk_size, budget)
        fits = n <= budget and self.kv.can_allocate(request.request_id, cached + n)
        if fits and self.running:
            fits = self.kv.num_free_blocks - self.kv.blocks_for(request.request_id, cached + n) >= self._watermark
        if fits and request.lora is not None:  # its adapter into a device slot (none free: it waits)
            assert self.adapters is not None
            slot = self.adapters.acquire(request.lora)
            fits = slot is not None
            request.lora_slot = -1 if slot is None else slot
        if not fits:
            self.kv.free(request.request_id)  # drops the prefix references taken above
            return None
        self.kv.allocate(request.request_id, cached + n)
        self.waiting.remove(request)
        self._join(request)
        request.state = RequestState.PREFILL
        request.num_computed_tokens = cached
        request.num_drafter_tokens = 0  # new blocks (and a cached prefix's) may hold no drafter KV: it starts over
        if request.num_preemptions == 0:
            request.num_cached_tokens = cached
        return self._row(request, n)

    def _prefix_in_progress(self, request: Request, cached: int) -> bool:
        """Whether a running prefill is about to cache the request's next full block (same tokens up to its end):
        admitted now, the request would compute it a second time; a step or two later it finds it cached."""
        end = cached + self.kv.block_size
        if end > request.num_tokens - 1:  # admission matches at most the prompt minus its last token
            return False
        head = request.token_ids[:end]
        return any(r.state is RequestState.PREFILL and r.num_computed_tokens < end <= r.num_tokens
                   and r.token_ids[:end] == head for r in self.running)

    def _grow(self, request: Request, num_tokens: int, scheduled: list[Request]) -> bool:
        """Blocks for num_tokens positions, preempting from the back of the running set (never a request that
        already has a row in this step: its slots would be freed under it). False: preempted, or must wait."""
        if not self.kv.blocks_for(request.request_id, num_tokens):
            return True
        while not self.kv.can_allocate(request.request_id, num_tokens):
            taken = set(map(id, scheduled))
            victim = next((r for r in reversed(self.running) if id(r) not in taken), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is request:
                return False
        self.kv.allocate(request.request_id, num_tokens)
        return True

    def _row(self, request: Request, num_new: int, drafts: tuple[int, ...] = ()) -> ScheduledRow:
        start = request.num_computed_tokens
        return ScheduledRow(
            request, start, num_new, self.kv.slots(request.request_id, start, num_new),
            self.kv.block_table(request.request_id),
            samples=start + num_new - len(drafts) == request.num_scheduled_tokens,
            prompt_logprobs=request.sampling_params.prompt_logprobs if request.needs_prompt_logprobs else None,
            drafts=drafts, pooling=request.sampling_params.pooling,
        )

    def _join(self, request: Request) -> None:
        """Into the running set, with a sampling slot the runner fills before the request's first step."""
        self.running.append(request)
        request.sampling_slot = self._free_slots.pop()
        self._joined.append(request)
        params = request.sampling_params
        self._with_history += params.needs_history
        self._with_logprobs += params.logprobs is not None
        self._with_probes += bool(request.probe_names) or params.probe_stop is not None
        self._with_pooling += params.pooling is not None

    def _leave(self, request: Request) -> None:
        self.running.remove(request)
        if request.lora_slot >= 0 and self.adapters is not None:
            self.adapters.release(request.lora_slot)
            request.lora_slot = -1
        if self.table is not None and request in self.table:
            self.table.leave(request)
        self._free_slots.append(request.sampling_slot)
        if request in self._joined:  # left before the step it joined for was built (failed, aborted)
            self._joined.remove(request)
        params = request.sampling_params
        self._with_history -= params.needs_history
        self._with_logprobs -= params.logprobs is not None
        self._with_probes -= bool(request.probe_names) or params.probe_stop is not None
        self._with_pooling -= params.pooling is not None

    def _preempt(self, request: Request) -> None:
        """Recompute later: free the blocks, keep the tokens, go back to the front of the queue."""
        self._leave(request)
        self.kv.free(request.request_id)
        request.state = RequestState.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
