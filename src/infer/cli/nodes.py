"""A host or torchrun rank other than 0 in a multi-node tensor-parallel launch: it runs workers, never serves."""

from __future__ import annotations

import sys


def headless_node(config) -> bool:  # (EngineConfig) imported lazily: startup time
    """Whether this process runs tensor-parallel workers only: a node other than 0, or a torchrun rank other than 0."""
    from infer.distributed.torchrun import under_torchrun

    if config.node_rank == 0 and not under_torchrun():  # node 0 without torchrun: no need to import torch to say so
        return False
    from infer.distributed.startup import distributed_config, headless

    return headless(distributed_config(config))


def run_headless_node(config) -> int:
    """A node (or torchrun rank) other than 0: tensor-parallel workers only, until rank 0 stops."""
    from infer.distributed.startup import distributed_config, run_headless

    config = distributed_config(config)
    print(f"[infer] headless: tensor-parallel ranks of node {config.node_rank} of {config.nnodes}, rendezvous at "
          f"{config.master_addr}:{config.master_port}", file=sys.stderr, flush=True)
    return run_headless(config)
