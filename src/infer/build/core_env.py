"""The environment the engine-core process starts with.

OpenMP's default wait policy spins its threads between parallel regions. The core's OpenMP threads take every
core of a CPU, so any other busy thread on the machine (the API server tokenizing a large prompt, a grammar
compile, detokenizing many streams, another program) leaves one of them waiting on a descheduled peer: on 2
cores a decode step that takes 10 ms took 1.2-1.8 s beside one busy thread. The core's threads therefore wait
passively after a bounded spin. With no spin at all (OMP_WAIT_POLICY=PASSIVE alone) every parallel region paid a
futex wake-up and the bundled model's streamed batch-1 decode fell from ~185 to ~86 tok/s on 2 cores. The spin is
20,000 rounds (~1 ms on a 2-core Zen 4 VM): an eager prefill leaves gaps of Python between its ~300 parallel
regions (median 69 us, a quarter over 100 us for a 128-token prompt), and 2,000 rounds (~0.1 ms) woke the threads
after each of those, which made a float32 SmolLM2's time to first token 1.12x this one's through `infer serve`
(alternated request by request); beside a large tokenization or a grammar compile a stream's largest gap stays
6-15 of its median gaps (2,000 rounds: 2-5; the stalls this guards against were 600-5,000). docs/serving.md.
A value the user set wins.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

CORE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "20000"}  # libgomp: spin this long, then sleep


@contextlib.contextmanager
def core_environment() -> Iterator[None]:
    """os.environ with CORE_ENV's defaults while a core process is spawned (it copies the environment)."""
    added = {name: value for name, value in CORE_ENV.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
