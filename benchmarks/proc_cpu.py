"""CPU seconds of a process tree by role, read from /proc (Linux): which process of `infer serve` a serving
benchmark saturates.

    before = tree_cpu(server_pid); ...run...; used = cpu_delta(before, tree_cpu(server_pid))

Roles: `launcher` (the root), `core` (a process that mapped libtorch: an engine core or a TP worker),
`api` (every other descendant: the API servers, which import no torch).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... utime(12th) stime(13th)
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "launcher"
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "api"
    return "core" if "libtorch" in maps else "api"


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """Every live process under `root` (itself included): pid -> (role, CPU seconds so far)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            stats[int(entry)] = stat
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return {pid: (_role(pid, root), stats[pid][1]) for pid in tree if pid in stats}


def cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, list[float]]:
    """CPU seconds each process used between the two readings, grouped by role (largest first)."""
    out: dict[str, list[float]] = {}
    for pid, (role, seconds) in after.items():
        out.setdefault(role, []).append(round(seconds - before.get(pid, (role, 0.0))[1], 2))
    return {role: sorted(values, reverse=True) for role, values in sorted(out.items())}
