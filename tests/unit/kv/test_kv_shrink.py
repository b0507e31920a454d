"""KVCacheManager.shrink: rolled-back positions give their blocks back; cached (published) blocks are kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infer.kv.kv_manager import KVCacheManager, blocks_needed


@settings(max_examples=200, deadline=None)
@given(known=st.integers(1, 40), drafts=st.integers(0, 9), accepted=st.integers(0, 9), caching=st.booleans())
def test_shrink_frees_exactly_the_blocks_past_the_kept_positions(known: int, drafts: int, accepted: int,
                                                                 caching: bool) -> None:
    accepted = min(accepted, drafts)
    kv = KVCacheManager(num_blocks=32, block_size=4, prefix_caching=caching)
    tokens = list(range(100, 100 + known))
    kv.allocate("r", known + drafts)
    kv.publish("r", tokens, known)  # only known tokens are ever published
    kept = known + accepted
    kv.shrink("r", kept)
    assert len(kv.block_table("r")) == max(blocks_needed(kept, 4), known // 4 if caching else 0)
    assert set(kv.audit_blocks()) == set(kv.block_table("r"))  # nothing held outside the table
    kv.free("r")
    assert kv.audit_blocks() == {}
