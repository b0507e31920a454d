"""PerfDB: schema, statistics, confidence, staleness, and several processes writing at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.synchronize
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from layerzero.perf import perfdb

from layerzero.perf.perfdb import PerfDB, capabilities_hash, confidence, get_perfdb
from layerzero.policy import state as policy

KEY = ("attention", "torch.sdpa", "bf16|d128|s512|b4", "cpu|test")


@pytest.fixture
def db(tmp_path: Path) -> PerfDB:
    return PerfDB(tmp_path / "perf.sqlite")


def test_wal_mode_and_schema(db: PerfDB) -> None:
    conn = sqlite3.connect(db.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = {row[1] for row in conn.execute("PRAGMA table_info(perf_records)")}
    assert {"operation", "kernel_id", "bucket", "device_sig", "median_us", "p95_us", "samples", "variance_us",
            "warmup_ms", "kernel_version", "layerzero_version", "torch_version", "capabilities_hash",
            "measured_at", "valid"} <= cols


def test_record_lookup_statistics(db: PerfDB) -> None:
    rng = np.random.default_rng(0)
    samples = rng.uniform(10.0, 20.0, size=37).tolist()
    stats = db.record(*KEY, samples, warmup_ms=4.5)
    found = db.lookup(*KEY)
    assert found == stats
    assert found.n == 37 and found.warmup_ms == 4.5
    assert found.median_us == pytest.approx(np.median(samples))
    assert found.p10_us == pytest.approx(np.quantile(samples, 0.10))
    assert found.p90_us == pytest.approx(np.quantile(samples, 0.90))
    assert db.lookup("attention", "torch.sdpa", "other-bucket", "cpu|test") is None
    assert db.lookup("attention", "other.kernel", *KEY[2:]) is None


def test_records_merge_and_keep_warmup(db: PerfDB) -> None:
    db.record(*KEY, [10.0] * 5, warmup_ms=3.0)
    merged = db.record(*KEY, [30.0] * 6)
    assert merged.n == 11 and merged.median_us == 30.0 and merged.warmup_ms == 3.0
    many = db.record(*KEY, [20.0] * (perfdb.MAX_SAMPLES + 3))
    assert many.n == perfdb.MAX_SAMPLES and many.median_us == 20.0


@pytest.mark.parametrize("bad", [[], [-1.0], [float("nan")], [float("inf")]])
def test_record_rejects_bad_samples(db: PerfDB, bad: list[float]) -> None:
    with pytest.raises(ValueError):
        db.record(*KEY, bad)


def test_confidence_grows_with_samples_and_shrinks_with_spread() -> None:
    assert confidence(0, 10, 10, 10) == 0.0
    assert confidence(5, 10, 10, 10) < confidence(20, 10, 10, 10) == 1.0 == confidence(200, 10, 10, 10)
    assert confidence(20, 10, 9, 11) < 1.0
    assert confidence(20, 10, 5, 20) < confidence(20, 10, 9, 11)
    assert all(0.0 <= confidence(n, 10, 1, 100) <= 1.0 for n in (1, 50))


def test_other_versions_and_capabilities_are_stale(db: PerfDB, tmp_path: Path) -> None:
    db.record(*KEY, [10.0] * 4, kernel_version="1.0", capabilities_hash="aaa")
    assert db.lookup(*KEY, kernel_version="1.0", capabilities_hash="aaa").n == 4
    assert db.lookup(*KEY, kernel_version="2.0", capabilities_hash="aaa") is None
    assert db.lookup(*KEY, kernel_version="1.0", capabilities_hash="bbb") is None
    upgraded = PerfDB(db.path)
    upgraded.torch_version = "9.9.9"
    assert upgraded.lookup(*KEY, kernel_version="1.0", capabilities_hash="aaa") is None
    # a record under the new provenance replaces the stale row instead of merging with it
    assert upgraded.record(*KEY, [50.0], kernel_version="1.0", capabilities_hash="aaa").n == 1
    assert db.lookup(*KEY, kernel_version="1.0", capabilities_hash="aaa") is None


def test_purge_stale(db: PerfDB) -> None:
    db.record("rms_norm", "k.a", "b", "d", [1.0], kernel_version="1", capabilities_hash="x")
    db.record("rms_norm", "k.b", "b", "d", [1.0], kernel_version="1", capabilities_hash="x")
    db.record("rms_norm", "k.c", "b", "d", [1.0])
    old = PerfDB(db.path)
    old.layerzero_version = "0.0.1"
    old.record("rms_norm", "k.old", "b", "d", [1.0])
    assert db.count() == 4
    assert db.purge_stale({"k.a": ("1", "x"), "k.b": ("2", "x")}) == 2  # k.old (version) and k.b (kernel version)
    assert db.lookup("rms_norm", "k.a", "b", "d", kernel_version="1", capabilities_hash="x") is not None
    assert db.lookup("rms_norm", "k.c", "b", "d") is not None
    assert db.count() == 2


def test_invalidate(db: PerfDB) -> None:
    db.record("rope", "k.a", "b", "d", [1.0])
    db.record("rope", "k.b", "b", "d", [1.0])
    assert db.invalidate(kernel_id="k.a") == 1
    assert db.lookup("rope", "k.a", "b", "d") is None and db.lookup("rope", "k.b", "b", "d") is not None
    assert db.record("rope", "k.a", "b", "d", [2.0]).n == 1  # a fresh measurement revalidates the key
    assert db.invalidate(op="rope") == 2 and db.purge_stale() == 2


def test_capabilities_hash_tracks_declared_constraints() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Spec:
        kernel_id: str
        dtypes: frozenset
        max_head_dim: int | None
        impl: object = print

    a = capabilities_hash(Spec("k", frozenset({"bf16", "fp16"}), 256))
    assert a == capabilities_hash(Spec("k", frozenset({"fp16", "bf16"}), 256, impl=len))
    assert a != capabilities_hash(Spec("k", frozenset({"fp16"}), 256))
    assert a != capabilities_hash(Spec("k", frozenset({"bf16", "fp16"}), 128))


def test_get_perfdb_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def env(name: str, value: str) -> None:  # the policy reads LAYERZERO_* variables on reset
        monkeypatch.setenv(name, value)
        policy.reset()

    try:
        env("LAYERZERO_PERFDB_PATH", str(tmp_path / "sub" / "p.sqlite"))
        db = get_perfdb()
        assert db is not None and db.path == tmp_path / "sub" / "p.sqlite" and db.path.exists()
        assert get_perfdb() is db
        env("LAYERZERO_PERFDB", "off")
        assert get_perfdb() is None
        env("LAYERZERO_PERFDB", "on")
        (tmp_path / "file").write_text("not a directory")
        env("LAYERZERO_PERFDB_PATH", str(tmp_path / "file" / "p.sqlite"))
        assert get_perfdb() is None
    finally:
        monkeypatch.undo()
        policy.reset()


def test_perfdb_location_follows_policy_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "layerzero.yaml"
    config.write_text(f"perfdb:\n  path: {tmp_path / 'yaml.sqlite'}\n")
    monkeypatch.setenv("LAYERZERO_CONFIG", str(config))
    monkeypatch.delenv("LAYERZERO_PERFDB_PATH", raising=False)
    monkeypatch.delenv("LAYERZERO_PERFDB", raising=False)
    try:
        policy.reset()
        assert perfdb.perfdb_location() == tmp_path / "yaml.sqlite"
        monkeypatch.setenv("LAYERZERO_PERFDB_PATH", str(tmp_path / "env.sqlite"))
        policy.reset()
        assert perfdb.perfdb_location() == tmp_path / "env.sqlite"
        assert policy.get_policy().sources["perfdb_path"] == "env:LAYERZERO_PERFDB_PATH"
        policy.configure(perfdb={"path": str(tmp_path / "configured.sqlite")})
        assert perfdb.perfdb_location() == tmp_path / "configured.sqlite"
        policy.configure(perfdb={"enabled": False})
        assert get_perfdb() is None
    finally:
        monkeypatch.undo()
        policy.reset()


WORKERS, WRITES = 3, 30


def _writer(path: str, worker: int, start: mp.synchronize.Barrier) -> None:
    db = PerfDB(path)
    start.wait(timeout=60)  # all writers begin together, so their transactions really contend
    for i in range(WRITES):
        db.record(*KEY, [float(worker * 1000 + i)])
        db.record("rms_norm", f"kernel.{worker}", f"bucket.{i % 3}", "cpu|test", [float(i)])


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_writer, args=(path, w, start)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    db = PerfDB(path)
    shared = db.lookup(*KEY)
    assert shared.n == WORKERS * WRITES  # every read-modify-write merged, none lost
    row = sqlite3.connect(path).execute("SELECT samples_json FROM perf_records WHERE kernel_id = 'torch.sdpa'").fetchone()
    values = sorted(json.loads(row[0]))
    assert values == sorted(float(w * 1000 + i) for w in range(WORKERS) for i in range(WRITES))
    for w in range(WORKERS):
        for b in range(3):
            assert db.lookup("rms_norm", f"kernel.{w}", f"bucket.{b}", "cpu|test").n == WRITES // 3
    assert db.count() == 1 + WORKERS * 3
