"""Whether torchrun started this process: read from its environment, without torch (the launcher asks before it
decides to import the distributed stack)."""

from __future__ import annotations

import os

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """Started by torchrun (or anything that sets its variables): ranks, devices and the rendezvous come from it."""
    return all(name in os.environ for name in TORCHRUN_VARS)
