"""The decode state of the running requests in persistent arrays, so a decode step costs the host what changed.

One row per request that is decoding: the positions it has scheduled, where its budget ends, its KV block table,
its sampling slot, and whether EOS ends it and its outputs are plain (the core's end checks read these as arrays).
The scheduler keeps the rows in step with its own state changes (a request joins when its prompt is computed, leaves
when it finishes or is preempted, grows a block every `block_size` tokens, advances one position per launched
step), and a decode step's inputs are read off the arrays with vector operations instead of a Python loop over the
requests. Invariant: every row equals what `rebuild` would compute from the request and the
KV manager (tests/unit/engine/test_decode_table.py checks it after random joins, leaves, growths and advances).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from infer.engine.request import Request
from infer.kv.kv_manager import KVCacheManager


class DecodeRows(NamedTuple):
    """A decode step's rows read off the table: one input token per request, at its last scheduled position."""

    requests: list[Request]
    index: np.ndarray  # int64 [n]: the table rows they were read from
    version: int  # the table's version then: the rows still stand while it is unchanged
    positions: np.ndarray  # int64 [n]: the position of each row's input token
    slot_mapping: np.ndarray  # int64 [n]: the KV slot that position is written to
    context_lens: np.ndarray  # int64 [n]: positions in cache after the step
    block_tables: np.ndarray  # int32 [n, width]: each row's blocks (width: the longest table among them)
    sampling_slots: np.ndarray  # int64 [n]
    limits: np.ndarray  # int64 [n]: the known tokens at which each request ends (max_tokens, max_seq_len)
    stops_at_eos: np.ndarray  # bool [n]: an EOS token ends it (not ignore_eos)
    plain: np.ndarray  # bool [n]: its outputs need no per-token work but the EOS and length checks


class DecodeTable:
    """Rows of the decoding requests; a leaving row is replaced by the last one (O(1), no order is promised)."""

    def __init__(self, capacity: int, max_blocks: int, block_size: int, max_seq_len: int) -> None:
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.requests: list[Request] = []
        self.version = 0  # moves when a row leaves (rows move)
        self._row: dict[int, int] = {}  # id(request) -> row
        self.scheduled = np.zeros(capacity, dtype=np.int64)  # request.num_scheduled_tokens
        self.limit = np.zeros(capacity, dtype=np.int64)  # scheduled this far, the pending tokens end the request
        self.blocks = np.zeros((capacity, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(capacity, dtype=np.int64)
        self.sampling_slot = np.zeros(capacity, dtype=np.int64)
        self.stops_at_eos = np.zeros(capacity, dtype=bool)
        self.plain = np.zeros(capacity, dtype=bool)

    def __len__(self) -> int:
        return len(self.requests)

    def __contains__(self, request: Request) -> bool:
        return id(request) in self._row

    def join(self, request: Request, block_table: list[int]) -> None:
        """A request whose prompt is computed starts decoding."""
        i = len(self.requests)
        self.requests.append(request)
        self._row[id(request)] = i
        self.scheduled[i] = request.num_scheduled_tokens
        self.limit[i] = min(request.max_total_tokens, self.max_seq_len)
        self.sampling_slot[i] = request.sampling_slot
        self.stops_at_eos[i] = not request.sampling_params.ignore_eos
        self.plain[i] = request.plain_outputs
        self.num_blocks[i] = 0
        self.set_blocks(request, block_table)

    def leave(self, request: Request) -> None:
        """The request finished or was preempted: the last row moves into its place."""
        i = self._row.pop(id(request))
        self.version += 1
        last = len(self.requests) - 1
        moved = self.requests.pop()
        if i != last:
            self.requests[i] = moved
            self._row[id(moved)] = i
            for column in (self.scheduled, self.limit, self.num_blocks, self.sampling_slot, self.stops_at_eos,
                           self.plain):
                column[i] = column[last]
            self.blocks[i, : self.num_blocks[i]] = self.blocks[last, : self.num_blocks[i]]

    def set_blocks(self, request: Request, block_table: list[int]) -> None:
        """The request's table grew (or is new): write the blocks past those the row holds."""
        i = self._row[id(request)]
        have = int(self.num_blocks[i])
        if len(block_table) < have:
            raise ValueError(f"{request.request_id!r}: a decoding request's block table shrank "
                             f"({have} -> {len(block_table)} blocks)")
        self.blocks[i, have : len(block_table)] = block_table[have:]
        self.num_blocks[i] = len(block_table)

    def short_of_blocks(self) -> list[Request]:
        """Requests whose next position needs a block their table lacks (one in `block_size` steps each)."""
        n = len(self.requests)
        needed = -(-self.scheduled[:n] // self.block_size)
        rows = np.flatnonzero((needed > self.num_blocks[:n]) & (self.scheduled[:n] < self.limit[:n]))
        return [self.requests[i] for i in rows]

    def rows(self, excluded: set[int]) -> DecodeRows:
        """Every row whose budget is not reached by its pending tokens, but those whose id(request) is excluded."""
        n = len(self.requests)
        active = self.scheduled[:n] < self.limit[:n]
        for rid in excluded:
            i = self._row.get(rid)
            if i is not None:
                active[i] = False
        index = np.flatnonzero(active)
        positions = self.scheduled[index] - 1
        width = int(self.num_blocks[index].max()) if len(index) else 0
        tables = self.blocks[index, :width]
        bs = self.block_size
        slots = tables[np.arange(len(index)), positions // bs].astype(np.int64) * bs + positions % bs
        return DecodeRows([self.requests[i] for i in index], index, self.version, positions, slots, positions + 1, tables,
                          self.sampling_slot[index], self.limit[index], self.stops_at_eos[index], self.plain[index])

    def advanced(self, rows: DecodeRows) -> None:
        """The rows' step was launched: each scheduled one more position (a request that left meanwhile, ended
        by the step before, is gone from the table)."""
        if rows.version == self.version:
            self.scheduled[rows.index] += 1
        else:
            self.scheduled[[self._row[id(r)] for r in rows.requests if id(r) in self._row]] += 1

    def rebuild(self, request: Request, kv: KVCacheManager) -> tuple[int, int, list[int], int, bool, bool]:
        """The request's row as it should be (scheduled, limit, block table, sampling slot, stops at EOS, plain),
        from scratch."""
        return (request.num_scheduled_tokens, min(request.max_total_tokens, self.max_seq_len),
                kv.block_table(request.request_id), request.sampling_slot, not request.sampling_params.ignore_eos,
                request.plain_outputs)

    def row_of(self, request: Request) -> tuple[int, int, list[int], int, bool, bool]:
        """The request's row as the arrays hold it, in `rebuild`'s form."""
        i = self._row[id(request)]
        return (int(self.scheduled[i]), int(self.limit[i]), self.blocks[i, : self.num_blocks[i]].tolist(),
                int(self.sampling_slot[i]), bool(self.stops_at_eos[i]), bool(self.plain[i]))
