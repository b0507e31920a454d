"""`infer serve` raises its soft open-file limit so the connection cap follows the hard limit, not a shell's 1,024."""

from __future__ import annotations

import resource

import pytest

from infer.server.limits import RESERVED_FDS, ServerLimits, raise_open_file_limit


@pytest.fixture
def restore_limit():
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield before
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_soft_limit_rises_to_the_wanted_value_within_the_hard_one(restore_limit):
    _, hard = restore_limit
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"hard open-file limit {hard}: no room to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    assert ServerLimits().connection_cap() == 1024 - RESERVED_FDS
    assert raise_open_file_limit(2048) == 2048
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (2048, hard)
    assert ServerLimits().connection_cap() == 2048 - RESERVED_FDS


def test_it_never_exceeds_the_hard_limit_nor_lowers_the_soft_one(restore_limit):
    soft, hard = restore_limit
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        pytest.skip("unlimited open files")
    assert raise_open_file_limit(hard + 10_000) == hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    assert raise_open_file_limit(16) == hard  # a lower wish leaves it alone
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
