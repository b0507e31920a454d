"""Which data-parallel engine core takes a request: the one routing decision of `--data-parallel-size N`.

An API server holds one `Router` and asks it once per request (each choice of a request with n > 1 or several
prompts is routed on its own). Policies (`--load-balance-method`):

- least_load (default): the engine with the fewest live requests (waiting, running or on their way) over every
  API server, as the shared LoadBoard (load_board.py) holds them when the request is routed; each submit counts
  at once, so a burst spreads evenly. Ties go to the router's `first` engine, then the ones after it (API server
  i starts at engine i).
- round_robin: engines in turn from the router's `first`, regardless of load.
- prefix_affinity: the first `PREFIX_BLOCKS` full KV blocks of the prompt (fewer if the prompt is shorter) are
  hashed to a "home" engine, so prompts that share that prefix meet its prefix cache. The home engine is kept
  while its load is at most `AFFINITY_FACTOR` x the least load + `AFFINITY_SLACK`; beyond that, and for prompts
  shorter than one block, least_load decides. The hash is stable across processes: every API server sends a
  prefix to the same engine.

An engine whose waiting queue is full (max_waiting_requests) is never picked; with every queue full `pick`
returns None (the server answers 503).
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Sequence
from typing import NamedTuple

from infer.engine.config import LOAD_BALANCE_METHODS

PREFIX_BLOCKS = 4  # prefix_affinity hashes at most this many leading full blocks (64 tokens with block_size 16)
AFFINITY_FACTOR = 2  # the home engine is kept while its load <= FACTOR * least load + SLACK
AFFINITY_SLACK = 4


class EngineLoad(NamedTuple):
    """One engine's load as an API server sees it."""

    requests: int  # live requests on the engine (waiting, running or on their way), every API server's
    full: bool  # the waiting queue is at max_waiting_requests: no new request goes there


class Router:
    """Picks an engine index per request under one load-balance method."""

    def __init__(self, method: str, engines: int, block_size: int, prefix_blocks: int = PREFIX_BLOCKS,
                 first: int = 0) -> None:
        if method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"load_balance_method={method!r}: must be one of {', '.join(LOAD_BALANCE_METHODS)}")
        if engines < 1:
            raise ValueError(f"data_parallel_size={engines!r}: must be >= 1")
        if block_size < 1 or prefix_blocks < 1:
            raise ValueError(f"block_size={block_size}, prefix_blocks={prefix_blocks}: both must be >= 1")
        self.method = method
        self.engines = engines
        self.block_size = block_size
        self.prefix_blocks = prefix_blocks
        self.first = first % engines  # where ties (least_load) and turns (round_robin) start
        self._turn = itertools.count(self.first)

    def pick(self, prompt_token_ids: Sequence[int], loads: Sequence[EngineLoad], adapter: str | None = None) -> int | None:
        """The engine for this request (`adapter`: the LoRA adapter it runs), or None when every engine's waiting queue
        is full."""
        if len(loads) != self.engines:
            raise ValueError(f"got loads of {len(loads)} engines, the router has {self.engines}")
        open_ = [i for i, load in enumerate(loads) if not load.full]
        if not open_:
            return None
        if self.method == "round_robin":
            start = next(self._turn) % self.engines
            return min(open_, key=lambda i: (i - start) % self.engines)
        least = min(open_, key=lambda i: (loads[i].requests, (i - self.first) % self.engines))
        if self.method == "prefix_affinity":
            home = self.home(prompt_token_ids, adapter)
            if home is not None and not loads[home].full and \
                    loads[home].requests <= AFFINITY_FACTOR * loads[least].requests + AFFINITY_SLACK:
                return home
        return least

    def home(self, prompt_token_ids: Sequence[int], adapter: str | None = None) -> int | None:
        """The engine a prompt's leading blocks hash to, with its LoRA adapter's name (an adapter's KV is its own, so
        its prefixes meet on their own engine); None for a prompt shorter than one block."""
        blocks = min(len(prompt_token_ids) // self.block_size, self.prefix_blocks)
        if blocks == 0:
            return None
        head = array("q", prompt_token_ids[: blocks * self.block_size]).tobytes() + (adapter or "").encode()
        return int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "little") % self.engines
