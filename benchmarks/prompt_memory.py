"""The API server's memory around a prompt too long for the context: `infer serve --max-request-body-mb 128` on the
bundled model, a 10 MB and a 100 MB prompt, the API server's VmRSS before, just after the answer and 2 s later.

    python benchmarks/prompt_memory.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import serve_process  # noqa: E402  (the tests' `infer serve` subprocess harness)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    with serve_process("--max-request-body-mb", "128") as served:
        pid = httpx.get(f"{served.base_url}/health").json()["pid"]
        base = rss_mb(pid)
        for mb in (10, 100):
            body = json.dumps({"prompt": "word " * (mb * 200_000), "max_tokens": 1})
            start = time.perf_counter()
            r = httpx.post(f"{served.base_url}/v1/completions", content=body,
                           headers={"content-type": "application/json"}, timeout=300)
            seconds = time.perf_counter() - start
            peak = rss_mb(pid)
            time.sleep(2)
            print(f"{mb} MB prompt: HTTP {r.status_code} in {seconds:.2f}s ({r.json()['error']['code']}); API server "
                  f"RSS {base:.0f} MB before, {peak:.0f} MB just after, {rss_mb(pid):.0f} MB 2 s later")


if __name__ == "__main__":
    main()
