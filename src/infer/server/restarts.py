"""Data parallelism survives a dead engine core: `CoreRestarts` watches the cores from `infer serve`'s main process
and starts a core that exited again, on the same address. Its API servers have failed the dead core's requests and
routed new ones to the live cores meanwhile (infer/frontend/dp_client.py); their sockets reconnect by themselves once
the new core binds, which it does only when it has loaded and warmed up."""

from __future__ import annotations

import multiprocessing.connection
import threading
import time

from infer.build.core_process import CoreProcess, CoreStartError
from infer.server.console import ended, say

RETRY_S = 5.0  # after a failed restart


class CoreRestarts:
    """A thread that restarts any of `cores` that exits (the list is updated in place) until `stop()`."""

    def __init__(self, cores: list[CoreProcess]) -> None:
        self.cores = cores
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infer-core-restarts", daemon=True)

    def start(self) -> CoreRestarts:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more restarts (the server is stopping); waits for one in progress."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.is_set():
            sentinels = {core.process.sentinel: i for i, core in enumerate(self.cores)}
            for sentinel in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                if not self._stopping.is_set():
                    self._restart(sentinels[sentinel])  # type: ignore[index]

    def _restart(self, index: int) -> None:
        old = self.cores[index]
        old.process.join(1)
        say(f"error: engine core {index} (pid {old.info.pid}) {ended(old.process.exitcode)}; its requests failed, "
             f"the other {len(self.cores) - 1} engine(s) serve while it restarts")
        start = time.monotonic()
        while not self._stopping.is_set():
            try:
                self.cores[index] = CoreProcess.start(old.config, address=old.info.address, host_cpus=old.host_cpus)
                break
            except CoreStartError as exc:
                say(f"error: engine core {index} did not restart ({exc}); trying again in {RETRY_S:g} s")
                self._stopping.wait(RETRY_S)
        else:
            return
        self.restarts += 1
        say(f"engine core {index} restarted in {time.monotonic() - start:.1f}s (pid {self.cores[index].info.pid})")
