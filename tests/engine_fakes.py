"""A model-free runner and tokenizer for scheduler tests: the runner checks the KV bookkeeping it is given.

FakeRunner keeps its own copy of the cache (slot -> (position, token)); every step it reads each
sequence's context back through its block table, fails loudly if a slot holds the wrong token, and
"samples" a token that hashes the whole context, so a wrong or recomputed-wrongly cache changes outputs.
"""

from __future__ import annotations

import hashlib
import itertools

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.build.in_process import Engine
from infer.kv.kv_manager import KVCacheManager
from infer.runners.step import StepInput, StepKind, StepResult

VOCAB = 1000
EOS = 0


class FakeTokenizer:
    eos_token_ids = frozenset({EOS})

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" t{i}" for i in ids if not (skip_special_tokens and i == EOS))


class Done:
    """A launched step that has already finished."""

    def __init__(self, result: StepResult) -> None:
        self._result = result

    def result(self) -> StepResult:
        return self._result


class FakeRunner:
    vocab_size = VOCAB
    probes = None
    launches_ahead = True  # as a device runner: the overlap tests need it

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.cache: dict[int, tuple[int, int]] = {}
        self.log: list[tuple[StepKind, list[int]]] = []  # (kind, number of tokens per sequence)
        self.served: list[tuple[StepKind, list[int]]] = []  # (kind, seeds of the sequences: request identities)
        self.last: list[int] = []  # the previous step's sampled tokens ("on the device")
        self.prev_rows: list[list[int]] = []  # per step: rows fed from the previous step's tokens
        self.slots: dict[int, list[int]] = {}  # sampling slot -> [seed, steps], as the real runner keeps them

    def check(self) -> None:
        """The runner protocol's liveness check: one fake process never loses a rank."""

    def close(self) -> None:
        """Nothing outlives the fake."""

    def forward(self, step: StepInput) -> StepInput:
        """Nothing to queue: the fake runs the whole step in `sample`."""
        return step

    def execute(self, step: StepInput) -> StepResult:
        return self.sample(step, None).result()

    def sample(self, step: StepInput, masks: object) -> "Done":
        """Runs at once; rows with prev_rows >= 0 take the previous step's token, as the device would."""
        for joined in step.joined:
            self.slots[joined.slot] = [joined.seed, joined.steps]
        states = [self.slots[slot] for slot in step.sampling_slots]
        self.log.append((step.step_kind, list(step.query_lens)))
        self.served.append((step.step_kind, [seed for seed, _ in states]))
        self.prev_rows.append(list(step.prev_rows or []))
        tokens = list(step.token_ids)
        ends = list(itertools.accumulate(step.query_lens))
        for i, prev in enumerate(step.prev_rows or []):
            if prev >= 0:  # the row's last input token
                tokens[ends[i] - 1] = self.last[prev]
        for slot, pos, tok in zip(step.slot_mapping, step.positions, tokens):
            self.cache[slot] = (pos, tok)
        out = []
        samples = step.samples or [True] * step.num_seqs
        for table, ctx, state, counts in zip(step.block_tables, step.context_lens, states, samples):
            context = [self._read(table, p) for p in range(ctx)]
            digest = hashlib.sha256(repr((context, *state)).encode()).digest()
            out.append(1 + int.from_bytes(digest[:4], "little") % (VOCAB - 1))
            state[1] += counts
        self.last = out
        return Done(StepResult(token_ids=out))

    def _read(self, table: list[int], pos: int) -> int:
        slot = table[pos // self.block_size] * self.block_size + pos % self.block_size
        stored_pos, token = self.cache[slot]
        assert stored_pos == pos, f"slot {slot} holds position {stored_pos}, expected {pos}"
        return token


def fake_engine(num_blocks: int = 64, block_size: int = 4, core_only: bool = False,
                **options: object) -> tuple[Engine, FakeRunner]:
    """An Engine (or with `core_only` the bare EngineCore a core process runs) on the fake runner."""
    config = EngineConfig(max_seq_len=options.pop("max_seq_len", 256), **options)  # type: ignore[arg-type]
    runner = FakeRunner(block_size)
    kv = KVCacheManager(num_blocks, block_size, prefix_caching=bool(config.use_prefix_caching))
    return (EngineCore if core_only else Engine)(config, runner, kv, FakeTokenizer()), runner  # type: ignore[arg-type,return-value]


def run_all(engine: Engine, max_steps: int = 10_000) -> dict[str, list]:
    """Step until idle; every request's outputs in order (asserts termination)."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError(f"engine did not finish within {max_steps} steps")
