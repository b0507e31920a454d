"""Plans: a caller whose calls repeat exactly under one signature vouches for its bound sites once per pass.

A model's forward is a deterministic function of its batch's metadata: under the same signature (token count,
sequence count, bounds, cache shapes) every call site sees the same shapes, strides, dtypes and values as the
last time. `with lz.plan(signature):` around the forward turns that fact into a token, interned per
(signature, selection GENERATION, policy in force, determinism flag, capture state), so one check per pass
replaces the guard of every call. A bound site (`layerzero.dispatch.bound`) trusts a token once it ran its
full guard under it in two passes and was called once in the first; then its call costs a context-variable
read and an identity test. Invariant: a site vouched for a token runs what its guard would have accepted,
provided the caller's signature determines its calls (the caller's promise). A policy or registry change
makes new tokens, so the next pass runs the guards again.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import count

import torch

from layerzero.policy.state import get_policy
from layerzero.select.capture import is_capturing
from layerzero.select.generation import GENERATION


class Token:
    """One interned plan key; holds the policy it was made under, so that policy's id stays unique."""

    __slots__ = ("key", "policy")

    def __init__(self, key: tuple[Hashable, ...], policy: object) -> None:
        self.key, self.policy = key, policy


class Pass:
    """One pass under a plan: the token, and a serial telling passes apart (a site called twice in one pass is
    never vouched)."""

    __slots__ = ("token", "serial")

    def __init__(self, token: Token, serial: int) -> None:
        self.token, self.serial = token, serial


CURRENT: ContextVar[Pass | None] = ContextVar("layerzero_plan", default=None)
_TOKENS: dict[tuple[Hashable, ...], Token] = {}
_MAX_TOKENS = 4096
_serials = count()


@contextmanager
def plan(signature: Hashable) -> Iterator[None]:
    """Vouch that every bound call inside repeats exactly whenever `signature` (hashable) repeats."""
    if torch.compiler.is_compiling():  # traced code goes through the custom ops, not bound kernels
        yield
        return
    policy = get_policy()
    key = (signature, GENERATION.value, id(policy), torch.are_deterministic_algorithms_enabled(), is_capturing())
    token = _TOKENS.get(key)
    if token is None:
        if len(_TOKENS) >= _MAX_TOKENS:  # old tokens are dropped; sites trusting them run their guards again
            _TOKENS.clear()
        token = _TOKENS.setdefault(key, Token(key, policy))
    reset = CURRENT.set(Pass(token, next(_serials)))
    try:
        yield
    finally:
        CURRENT.reset(reset)
