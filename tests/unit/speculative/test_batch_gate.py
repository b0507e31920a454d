"""BatchGatedProposer: drafts only while fewer than `disable_at` requests run; gate_speculation wraps n-gram only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infer.engine.config import EngineConfig, EngineConfigError
from infer.speculative.gate import BatchGatedProposer, gate_speculation
from infer.speculative.ngram import NgramProposer

TOKENS = [1, 2, 3, 1, 2]  # "1 2" occurred before: a lookup proposes what followed it


def test_drafts_below_the_threshold_and_none_at_it():
    running: list[object] = []
    gate = BatchGatedProposer(NgramProposer(2, 1, 2), running, disable_at=2)
    running.append("a")
    assert gate.propose(TOKENS, 4) == [3, 1]
    running.append("b")  # the scheduler's own list: the gate sees it grow
    assert gate.propose(TOKENS, 4) == []


def test_gate_speculation_wraps_ngram_only_and_not_with_0():
    ngram = SimpleNamespace(proposer=NgramProposer(2, 1, 2), running=[])
    gate_speculation(ngram, 2)
    assert isinstance(ngram.proposer, BatchGatedProposer) and ngram.proposer.running is ngram.running
    never = SimpleNamespace(proposer=NgramProposer(2, 1, 2), running=[])
    gate_speculation(never, 0)
    assert isinstance(never.proposer, NgramProposer)
    other = SimpleNamespace(proposer=object(), running=[])
    gate_speculation(other, 2)
    assert not isinstance(other.proposer, BatchGatedProposer)


def test_the_threshold_is_checked():
    assert EngineConfig(device="cpu").speculative_disable_by_batch_size == 2
    assert EngineConfig(device="cuda").speculative_disable_by_batch_size == 0  # batch 32 still gained on an H100
    assert EngineConfig(device="cpu", speculative_disable_by_batch_size=0).speculative_disable_by_batch_size == 0
    with pytest.raises(EngineConfigError, match="speculative_disable_by_batch_size"):
        EngineConfig(speculative_disable_by_batch_size=-1)
