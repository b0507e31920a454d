"""`infer serve --runner mlx` with strict mode on: 16 concurrent completions (greedy and seeded) answer exactly as
the same 16 sent one by one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("mlx.core")

from checkpoints import save_tiny_with_tokenizer  # noqa: E402
from server_harness import serve_process  # noqa: E402

pytestmark = pytest.mark.slow

WORDS = ["cat", "mat", "name", "Tom", "yes", "no", "maybe", "today"]


def test_sixteen_concurrent_requests_answer_as_one_by_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")  # the engine-core process inherits it
    path = save_tiny_with_tokenizer("llama", tmp_path / "llama", seed=5)
    with serve_process("--model", str(path), "--runner", "mlx", "--max-seq-len", "256") as served:
        base = served.base_url
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        bodies = [{"model": model, "prompt": f"The {WORDS[i % 8]} sat on the {WORDS[(3 * i) % 8]}", "max_tokens": 12,
                   "ignore_eos": True, **({"temperature": 0} if i % 2 else {"temperature": 0.9, "seed": i})}
                  for i in range(16)]

        def complete(body: dict) -> str:
            r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        alone = [complete(b) for b in bodies]
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(complete, bodies))
        assert together == alone
        assert len(set(alone)) > 1
