"""Prefix cache and KV manager under random workloads (hypothesis): no block is reused while referenced,
every cached block holds the tokens its path spells, hit accounting is exact, and nothing leaks."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from infer.kv.kv_manager import CACHE_OWNER, KVCacheManager
from infer.kv.prefix_cache import PrefixCache

BS = 4

# a workload: requests over a tiny alphabet (so prefixes repeat), each computed in chunks, freed in some order
request = st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=24), st.integers(1, 9))
workload = st.lists(request, min_size=1, max_size=12)


class Device:
    """What the cache would hold: block -> the tokens written into it, checked on every read."""

    def __init__(self) -> None:
        self.content: dict[int, list[int | None]] = {}

    def write(self, kv: KVCacheManager, rid: str, tokens: list[int], start: int, count: int) -> None:
        for pos, slot in zip(range(start, start + count), kv.slots(rid, start, count)):
            self.content.setdefault(slot // BS, [None] * BS)[slot % BS] = tokens[pos]

    def check(self, kv: KVCacheManager, rid: str, tokens: list[int], upto: int) -> None:
        table = kv.block_table(rid)
        for pos in range(upto):
            assert self.content[table[pos // BS]][pos % BS] == tokens[pos], (rid, pos)


@settings(max_examples=150, deadline=None)
@given(workload, st.integers(6, 40), st.randoms(use_true_random=False))
def test_random_workloads_keep_every_invariant(requests, num_blocks, rnd):
    kv = KVCacheManager(num_blocks, BS, prefix_caching=True)
    device, live, queries, hits = Device(), {}, 0, 0
    for i, (tokens, chunk) in enumerate(requests):
        rid = f"r{i}"
        cached = kv.admit(rid, tokens, len(tokens) - 1)
        assert cached % BS == 0 and cached <= len(tokens) - 1
        device.check(kv, rid, tokens, cached)  # a hit reads exactly the tokens it claims
        done = cached
        while done < len(tokens):
            n = min(chunk, len(tokens) - done)
            if not kv.can_allocate(rid, done + n):
                break  # out of blocks: the request stops here (as if preempted) and is freed below
            if done == cached:  # the lookup counts once the request has blocks
                queries, hits = queries + len(tokens), hits + cached
            kv.allocate(rid, done + n)
            device.write(kv, rid, tokens, done, n)
            done += n
            kv.publish(rid, tokens, done)
        live[rid] = (tokens, done)
        owners, tree = kv.allocator.audit_blocks(), {n.block for n in kv.prefix.nodes()}  # type: ignore[union-attr]
        assert all(owners.get(b) == CACHE_OWNER for b in tree) and len(tree) == kv.prefix.num_cached  # type: ignore[union-attr]
        for other, (toks, computed) in live.items():
            assert all(owners[b] in (other, CACHE_OWNER) and (owners[b] == other or b in tree)
                       for b in kv.block_table(other))
            device.check(kv, other, toks, computed)  # nothing another request wrote has overwritten it
        if rnd.random() < 0.5:  # free a random live request
            victim = rnd.choice(sorted(live))
            kv.free(victim)
            del live[victim]
    for rid in list(live):
        kv.free(rid)
    assert kv.audit_blocks() == {}
    assert kv.prefix_queries == queries and kv.prefix_hits == hits
    assert kv.num_free_blocks == num_blocks  # every cached block is unreferenced, hence evictable


def test_eviction_takes_the_least_recently_used_leaf_first():
    cache = PrefixCache(2)
    (a,) = cache.insert(None, [(1, 2)], [10])
    (b,) = cache.insert(a, [(3, 4)], [11])
    (c,) = cache.insert(None, [(5, 6)], [12])
    cache.release([a, b])
    cache.release([c])
    assert cache.num_unreferenced == 3
    assert cache.evict(1) == [11]  # the leaf of the older chain, not its parent
    assert cache.evict(1) == [10]  # the parent became a leaf, and is older than c
    cache.acquire([c])
    assert cache.evict(1) == []  # c is referenced again
    assert cache.match([5, 6, 7], 3) == [c] and cache.match([1, 2], 2) == []


def test_a_childless_parent_goes_before_leaves_released_after_its_chain():
    cache = PrefixCache(2)
    (a,) = cache.insert(None, [(1, 2)], [10])
    (b,) = cache.insert(a, [(3, 4)], [11])
    (c,) = cache.insert(None, [(5, 6)], [12])
    (d,) = cache.insert(c, [(7, 8)], [13])
    cache.release([a, b])
    cache.release([c, d])
    assert cache.evict(3) == [11, 10, 13]  # chains leave whole, the older first, each from its tail
    assert cache.num_cached == cache.num_unreferenced == 1 and cache.evict(5) == [12]


def test_the_same_prefix_written_twice_is_cached_once():
    kv = KVCacheManager(8, BS, prefix_caching=True)
    tokens = [1, 2, 3, 4, 5]
    for rid in ("a", "b"):  # both compute the prompt before either publishes it
        kv.admit(rid, tokens, 4)
        kv.allocate(rid, 5)
    kv.publish("a", tokens, 5)
    kv.publish("b", tokens, 5)
    assert kv.prefix.num_cached == 1  # type: ignore[union-attr]
    kv.free("a")
    kv.free("b")
    assert kv.audit_blocks() == {} and kv.num_free_blocks == 8
    kv.admit("c", tokens, 4)
    assert kv.block_table("c") == [kv.prefix.nodes()[0].block]  # type: ignore[union-attr]


def test_a_chain_past_a_prefix_cached_by_another_request_goes_beneath_it():
    kv = KVCacheManager(16, BS, prefix_caching=True)
    shared, own = [1, 2, 3, 4], [5, 6, 7, 8, 9, 9, 9, 9]
    kv.admit("a", shared, 4)
    kv.allocate("a", 4)
    kv.admit("b", shared + own, 11)  # admitted before "a" published: it computes the shared block itself
    kv.allocate("b", 12)
    kv.publish("a", shared, 4)
    kv.publish("b", shared + own, 12)  # one call: its first block is cached already, the next two are new
    cache = kv.prefix
    assert cache is not None and cache.num_cached == 3
    owners = kv.allocator.audit_blocks()
    b_table = kv.block_table("b")
    assert owners[b_table[0]] == "b" and owners[b_table[1]] == owners[b_table[2]] == CACHE_OWNER
    kv.admit("c", shared + own + [0], 12)
    assert kv.block_table("c") == [kv.block_table("a")[0], b_table[1], b_table[2]]
    for rid in ("a", "b", "c"):
        kv.free(rid)
    assert kv.audit_blocks() == {} and kv.num_free_blocks == 16


def test_namespaces_never_share_blocks_and_evict_like_the_base():
    """A LoRA adapter's KV (namespace = its id) is never matched by the base model's requests or another adapter's,
    though the tokens are the same; its blocks are evicted and audited like any other."""
    kv = KVCacheManager(16, BS, prefix_caching=True)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    for rid, namespace in (("base", 0), ("lora", 7)):
        assert kv.admit(rid, tokens, len(tokens) - 1, namespace) == 0
        kv.allocate(rid, len(tokens))
        kv.publish(rid, tokens, len(tokens))
    assert kv.admit("lora-again", tokens, len(tokens) - 1, 7) == 2 * BS  # its own namespace: a hit
    assert kv.admit("other", tokens, len(tokens) - 1, 8) == 0
    assert kv.admit("base-again", tokens, len(tokens) - 1) == 2 * BS
    lora_blocks = {n.block for n in kv.prefix.nodes()} - set(kv.block_table("base"))
    assert set(kv.block_table("lora-again")) & set(kv.block_table("base-again")) == set()
    assert set(kv.block_table("lora-again")) <= lora_blocks
    for rid in ("base", "lora", "lora-again", "other", "base-again"):
        kv.free(rid)
    assert kv.audit_blocks() == {}
    kv.reset_prefix_cache()
    assert kv.prefix.num_cached == 0 and kv.num_free_blocks == 16
