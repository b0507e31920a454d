"""Serve sentiment.safetensors through the engine and re-measure its held-out AUC from the served scores.

`python -m omniscience train` scores residuals it captured with forward hooks; this runs the same held-out
texts through `infer.LLM(probes="probes.yaml")` and reads each request's first generated token's score
(the probe at the prompt's last position), so a mismatch between training and serving would show here.

    .venv/bin/python examples/probes/check_served.py      # after train.sh
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from infer import LLM, SamplingParams
from omniscience.cli import read_examples
from omniscience.train import accuracy, roc_auc, split

HERE = Path(__file__).resolve().parent


def main() -> None:
    with safe_open(str(HERE / "sentiment.safetensors"), "pt") as f:
        meta = f.metadata()
    examples = read_examples(HERE / "data.jsonl")
    _, held = split(len(examples.texts), float(meta["holdout"]), int(meta["seed"]), examples.labels)
    llm = LLM(None, probes=str(HERE / "probes.yaml"), dtype="float32", device="cpu", max_seq_len=512)
    max_tokens = int(meta["max_tokens"])
    prompts = [llm.encode(examples.texts[i])[:max_tokens] for i in held.tolist()]
    outputs = llm.generate_ids(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    scores = torch.tensor([out.probes["sentiment"][0] for out in outputs])
    labels = examples.labels[held]
    print(f"served on {len(held)} held-out rows: AUC {roc_auc(scores, labels):.4f}  accuracy "
          f"{accuracy(scores, labels):.4f}  (trainer reported AUC {float(meta['heldout_auc']):.4f}, "
          f"accuracy {float(meta['heldout_accuracy']):.4f})")
    for text in ("An absolute delight from start to finish.", "A tedious, joyless slog."):
        out = llm.generate([text], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0]
        print(f"  {out.probes['sentiment'][0]:.3f}  {text}")


if __name__ == "__main__":
    main()
