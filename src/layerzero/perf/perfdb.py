"""PerfDB: measured kernel timings in SQLite (WAL mode), shared safely by several processes.

One row per (operation, kernel_id, bucket, device_sig). A row also records its provenance
(layerzero, torch and kernel versions, the kernel's capabilities hash); a row whose provenance
differs from the caller's is stale: lookups ignore it, the next record replaces it, and
`purge_stale` deletes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import torch

from layerzero.policy.state import get_policy

SCHEMA_VERSION = 1
MAX_SAMPLES = 512  # most recent samples kept per row, so that writers can merge their measurements
FULL_CONFIDENCE_SAMPLES = 20  # the default tune_samples
BUSY_TIMEOUT_S = 30.0
DEFAULT_PATH = "~/.cache/layerzero/perfdb.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS perf_records (
    id INTEGER PRIMARY KEY,
    operation TEXT NOT NULL,
    kernel_id TEXT NOT NULL,
    bucket TEXT NOT NULL,             -- SelectionContext.perf_bucket(): dtype, head dim, shape buckets
    device_sig TEXT NOT NULL,         -- measure.device_signature(): device model, sm, driver, torch
    median_us REAL NOT NULL,
    p10_us REAL NOT NULL,
    p90_us REAL NOT NULL,
    p95_us REAL NOT NULL,
    variance_us REAL NOT NULL,
    samples INTEGER NOT NULL,
    samples_json TEXT NOT NULL,
    warmup_ms REAL,                   -- one-time warmup / JIT cost, kept apart from steady state
    kernel_version TEXT NOT NULL,
    layerzero_version TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    capabilities_hash TEXT NOT NULL,
    measured_at REAL NOT NULL,
    valid INTEGER NOT NULL DEFAULT 1,
    UNIQUE(operation, kernel_id, bucket, device_sig)
);
CREATE INDEX IF NOT EXISTS idx_lookup ON perf_records(operation, bucket, device_sig);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

T = TypeVar("T")


@dataclass(frozen=True)
class PerfStats:
    """Steady-state timing of one kernel in one bucket on one device, in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    n: int
    confidence: float  # in [0, 1]: grows with the sample count, shrinks with the spread
    warmup_ms: float | None = None


@cache
def layerzero_version() -> str:
    """Version of the distribution that ships layerzero."""
    try:
        return metadata.version("infer")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def capabilities_hash(spec: object) -> str:
    """Short hash of a KernelSpec's declared constraints (every dataclass field that is not a callable)."""
    parts = []
    for f in dataclasses.fields(spec):  # type: ignore[arg-type]
        value = getattr(spec, f.name)
        if not callable(value):
            parts.append(f"{f.name}={sorted(map(str, value)) if isinstance(value, frozenset) else value!r}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def confidence(n: int, median_us: float, p10_us: float, p90_us: float) -> float:
    """Confidence in [0, 1]: min(1, n / 20) scaled down by the relative p10-p90 spread."""
    if n <= 0 or median_us <= 0:
        return 0.0
    spread = (p90_us - p10_us) / median_us
    return min(1.0, n / FULL_CONFIDENCE_SAMPLES) / (1.0 + 4.0 * spread)


def _quantile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted samples."""
    pos = q * (len(sorted_samples) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def _retry(fn: Callable[[], T], attempts: int = 8) -> T:
    """Run fn, retrying with jittered backoff when SQLite reports the database busy or locked."""
    for attempt in range(attempts):
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if attempt == attempts - 1 or ("locked" not in text and "busy" not in text):
                raise
            time.sleep(0.01 * 2**attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")


class PerfDB:
    """SQLite-backed timing store; one connection per thread and process, WAL journal, busy timeout + retry."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.torch_version = torch.__version__
        self.layerzero_version = layerzero_version()
        self._local = threading.local()
        _retry(self._init_schema)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():  # never reuse a connection across fork
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _init_schema(self) -> None:
        conn = self._conn()
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
            raise sqlite3.OperationalError(f"could not switch {self.path} to WAL mode (database busy)")
        conn.execute("PRAGMA synchronous = NORMAL")
        with _write(conn):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        found = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        if int(found) != SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} has PerfDB schema v{found}, this layerzero reads v{SCHEMA_VERSION}")

    def _provenance(self, kernel_version: str, capabilities_hash: str) -> tuple[str, str, str, str]:
        return (kernel_version, self.layerzero_version, self.torch_version, capabilities_hash)

    def record(
        self,
        op: str,
        kernel_id: str,
        bucket: str,
        device_sig: str,
        samples_us: Sequence[float],
        *,
        kernel_version: str = "",
        capabilities_hash: str = "",
        warmup_ms: float | None = None,
    ) -> PerfStats:
        """Merge samples (µs) into the row for this key (replacing a stale row) and return the new stats."""
        new = [float(s) for s in samples_us]
        if not new or any(s < 0 or not math.isfinite(s) for s in new):
            raise ValueError(f"samples_us must be non-empty, finite, non-negative numbers, got {samples_us!r}")
        provenance = self._provenance(kernel_version, capabilities_hash)
        key = (op, kernel_id, bucket, device_sig)

        def write() -> PerfStats:
            conn = self._conn()
            with _write(conn):
                row = conn.execute(
                    "SELECT samples_json, warmup_ms, kernel_version, layerzero_version, torch_version, capabilities_hash,"
                    " valid FROM perf_records WHERE operation = ? AND kernel_id = ? AND bucket = ? AND device_sig = ?",
                    key,
                ).fetchone()
                merged = new
                old_warmup = None
                if row is not None and tuple(row[2:6]) == provenance and row[6]:
                    merged = (json.loads(row[0]) + new)[-MAX_SAMPLES:]
                    old_warmup = row[1]
                stats = _stats(merged, warmup_ms if warmup_ms is not None else old_warmup)
                ordered = sorted(merged)
                conn.execute(
                    "INSERT OR REPLACE INTO perf_records (operation, kernel_id, bucket, device_sig, median_us, p10_us,"
                    " p90_us, p95_us, variance_us, samples, samples_json, warmup_ms, kernel_version, layerzero_version,"
                    " torch_version, capabilities_hash, measured_at, valid)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
                    (
                        *key,
                        stats.median_us,
                        stats.p10_us,
                        stats.p90_us,
                        _quantile(ordered, 0.95),
                        statistics.pvariance(merged),
                        stats.n,
                        json.dumps(merged),
                        stats.warmup_ms,
                        *provenance,
                        time.time(),
                    ),
                )
            return stats

        return _retry(write)

    def lookup(
        self,
        op: str,
        kernel_id: str,
        bucket: str,
        device_sig: str,
        *,
        kernel_version: str = "",
        capabilities_hash: str = "",
    ) -> PerfStats | None:
        """Stats for this key, or None when there is no valid row with the caller's provenance."""
        row = _retry(
            lambda: self._conn()
            .execute(
                "SELECT median_us, p10_us, p90_us, samples, warmup_ms FROM perf_records WHERE operation = ?"
                " AND kernel_id = ? AND bucket = ? AND device_sig = ? AND valid = 1 AND kernel_version = ?"
                " AND layerzero_version = ? AND torch_version = ? AND capabilities_hash = ?",
                (op, kernel_id, bucket, device_sig, *self._provenance(kernel_version, capabilities_hash)),
            )
            .fetchone()
        )
        if row is None:
            return None
        median, p10, p90, n, warmup = row
        return PerfStats(median, p10, p90, n, confidence(n, median, p10, p90), warmup)

    def invalidate(self, *, op: str | None = None, kernel_id: str | None = None) -> int:
        """Mark matching rows invalid (all rows when both are None); returns how many."""
        where, params = _filter(op, kernel_id)

        def write() -> int:
            conn = self._conn()
            with _write(conn):
                return conn.execute(f"UPDATE perf_records SET valid = 0 WHERE valid = 1{where}", params).rowcount

        return _retry(write)

    def purge_stale(self, current: dict[str, tuple[str, str]] | None = None) -> int:
        """Delete invalid rows and rows from other layerzero/torch versions; returns how many.

        current maps kernel_id -> (kernel_version, capabilities_hash) of the kernels registered now;
        with it, rows of those kernels whose versions or capabilities differ are deleted too.
        """

        def write() -> int:
            conn = self._conn()
            with _write(conn):
                deleted = conn.execute(
                    "DELETE FROM perf_records WHERE valid = 0 OR layerzero_version != ? OR torch_version != ?",
                    (self.layerzero_version, self.torch_version),
                ).rowcount
                for kernel_id, (version, caps) in (current or {}).items():
                    deleted += conn.execute(
                        "DELETE FROM perf_records WHERE kernel_id = ? AND (kernel_version != ? OR capabilities_hash != ?)",
                        (kernel_id, version, caps),
                    ).rowcount
                return deleted

        return _retry(write)

    def count(self) -> int:
        """Number of rows, stale ones included."""
        return _retry(lambda: self._conn().execute("SELECT COUNT(*) FROM perf_records").fetchone()[0])

    def close(self) -> None:
        """Close this thread's connection (other threads' connections close when they are collected)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class _write:
    """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so read-modify-write cannot lose updates."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _filter(op: str | None, kernel_id: str | None) -> tuple[str, tuple[str, ...]]:
    clauses, params = [], []
    if op is not None:
        clauses.append("operation = ?")
        params.append(op)
    if kernel_id is not None:
        clauses.append("kernel_id = ?")
        params.append(kernel_id)
    return "".join(f" AND {c}" for c in clauses), tuple(params)


def _stats(samples: Sequence[float], warmup_ms: float | None) -> PerfStats:
    ordered = sorted(samples)
    median, p10, p90 = statistics.median(ordered), _quantile(ordered, 0.10), _quantile(ordered, 0.90)
    return PerfStats(median, p10, p90, len(ordered), confidence(len(ordered), median, p10, p90), warmup_ms)


_instances: dict[Path, PerfDB] = {}
_instances_lock = threading.Lock()
_failed: set[Path] = set()


def perfdb_location() -> Path | None:
    """Where the PerfDB lives, None when it is off: the policy's `perfdb` settings (layerzero.yaml's
    `perfdb:` section, LAYERZERO_PERFDB / LAYERZERO_PERFDB_PATH, `configure(perfdb=...)`), else DEFAULT_PATH."""
    settings = get_policy().settings
    return Path(settings.perfdb_path or DEFAULT_PATH).expanduser() if settings.perfdb_enabled else None


def get_perfdb() -> PerfDB | None:
    """The process's PerfDB at `perfdb_location()`, opened once per path.

    None when the PerfDB is off, or when it cannot be opened (a warning is logged once per path):
    timings only refine selection, so a missing PerfDB never fails a call.
    """
    path = perfdb_location()
    if path is None:
        return None
    db = _instances.get(path)
    if db is not None or path in _failed:
        return db
    with _instances_lock:
        if path not in _instances and path not in _failed:
            try:
                _instances[path] = PerfDB(path)
            except (OSError, sqlite3.Error, RuntimeError) as exc:
                _failed.add(path)
                logging.getLogger("layerzero").warning(
                    "PerfDB at %s unavailable, selection runs without timings: %s", path, exc
                )
        return _instances.get(path)
