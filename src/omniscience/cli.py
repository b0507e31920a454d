"""`python -m omniscience train`: fit a sentiment-style linear probe from labelled text, ready to serve.

The one place omniscience drives infer: `collect_activations` imports it inside the function, so importing
omniscience (or omniscience.cli) never loads the runtime. Everything else is argument and data checking
(before the model loads, so a bad file fails in a second) and calls into omniscience.train.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omniscience.config import ProbeError, read_config
from omniscience.train import accuracy, fit_logistic, roc_auc, save_probe, split, write_probe_yaml

POOLINGS = ("last", "mean")
DESCRIPTION = """\
Fit a linear probe  score = sigmoid(w . h + b)  on the residual stream h = blocks.{layer}.resid_post
(the output of block `layer`, before the final norm) of a model that infer runs, from a JSONL file of
{"text": ..., "label": 0 or 1} rows. One forward per batch of texts (float32, no KV cache) collects each text's
residual (its last token's, or the mean over its tokens); an L2-regularized logistic regression is fitted on
standardized features of a stratified training split and scored on the held-out rest (accuracy at 0.5, ROC AUC).
The saved .safetensors file (`weight` [hidden], `bias` []) is what `infer serve --probes probes.yaml` loads.

examples:
  python -m omniscience train --data data.jsonl --layers 4,8,12,16 --out probe.safetensors
  python -m omniscience train --data data.jsonl --layer 12 --out probe.safetensors --yaml probes.yaml
"""


class TrainError(ValueError):
    """A problem with the arguments or the data; printed as one line, no traceback."""


@dataclass(frozen=True)
class Examples:
    texts: list[str]
    labels: torch.Tensor  # [N] int64, 0 or 1
    lines: list[int]  # each row's 1-based line number in the file
    source: Path


@dataclass(frozen=True)
class Activations:
    features: torch.Tensor  # [N, len(layers), hidden] float32
    layers: list[int]
    model_name: str
    num_layers: int
    tokens: int  # tokens run through the model (after truncation)


def read_examples(path: Path, limit: int | None = None) -> Examples:
    """The first `limit` non-blank rows of a JSONL file, each checked; errors name the line."""
    if not path.is_file():
        raise TrainError(f"{path}: data file not found")
    texts, labels, lines = [], [], []
    with path.open(encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if limit is not None and len(texts) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TrainError(f"{where}: expected an object {{\"text\": ..., \"label\": 0 or 1}}")
            for field in ("text", "label"):
                if field not in row:
                    raise TrainError(f"{where}: missing field {field!r}")
            text, label = row["text"], row["label"]
            if not isinstance(text, str) or not text.strip():
                raise TrainError(f"{where}: 'text' must be a non-empty string; got {json.dumps(text)[:60]}")
            if isinstance(label, bool) or not isinstance(label, int) or label not in (0, 1):
                raise TrainError(f"{where}: 'label' must be 0 or 1; got {json.dumps(label)[:60]}")
            texts.append(text)
            labels.append(label)
            lines.append(number)
    if not texts:
        raise TrainError(f"{path}: no examples (the file is empty or holds only blank lines)")
    tensor = torch.tensor(labels, dtype=torch.int64)
    if bool((tensor == tensor[0]).all()):
        raise TrainError(f"{path}: only one class: all {len(texts)} rows read have label {labels[0]}; a probe needs "
                         "examples of both 0 and 1")
    for value in (0, 1):
        count = int((tensor == value).sum())
        if count < 2:
            raise TrainError(f"{path}: {count} row(s) with label {value} among the {len(texts)} read; a probe needs "
                             "at least 2 of each class (one to train on, one to hold out)")
    return Examples(texts, tensor, lines, path)


def parse_layers(spec: str) -> list[int] | str:
    """`4,8,12` -> [4, 8, 12]; `all` -> "all" (every layer, known once the model loads)."""
    if spec.strip().lower() == "all":
        return "all"  # not None: argparse would take None for "--layers not given"
    try:
        layers = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer numbers or 'all'; got {spec!r}") from None
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative layer numbers; got {spec!r}")
    return sorted(set(layers))


def collect_activations(model: str | None, examples: Examples, layers: list[int] | None, pooling: str,
                        max_tokens: int, batch_tokens: int, device: str) -> Activations:
    """Each text's pooled `resid_post` at each layer, from cache-free float32 forwards of packed texts."""
    from tqdm import tqdm

    from infer import LLM  # the one import of infer in omniscience: only this command runs the model
    from infer.models.forward_batch import ForwardBatch

    blocks = -(-max_tokens // 16) + 1  # one sequence's worth of KV cache: the forwards here use none
    try:
        llm = LLM(model, dtype="float32", device=device, max_seq_len=max_tokens, block_size=16, num_kv_blocks=blocks,
                  max_batch_size=1, use_cuda_graphs=False)
    except (ValueError, OSError) as exc:
        raise TrainError(f"cannot load model {model or '(bundled)'}: {exc}") from None
    net, num_layers = llm.runner.model, llm.model_config.num_hidden_layers
    layers = list(range(num_layers)) if layers is None else layers
    if max(layers) >= num_layers:
        raise TrainError(f"layer {max(layers)} is out of range: the model has {num_layers} layers (0-{num_layers - 1})")
    max_tokens = min(max_tokens, llm.config.max_seq_len)
    ids = []
    for text, line in zip(examples.texts, examples.lines):
        tokens = llm.tokenizer.encode(text)[:max_tokens]
        if not tokens:
            raise TrainError(f"{examples.source}:{line}: the text encodes to no tokens")
        ids.append(tokens)
    device_ = next(net.parameters()).device
    features = torch.zeros(len(ids), len(layers), llm.model_config.hidden_size)
    state: dict[str, Any] = {}  # the current forward's rows, first row and sequence bounds

    class Done(Exception):
        """Raised at the deepest probed layer: the blocks after it are not needed."""

    def hook(column: int) -> Callable[..., None]:
        def capture(_module: object, _inputs: object, output: torch.Tensor) -> None:
            rows, start = state["rows"], state["start"]
            bounds = state["bounds"]
            if pooling == "last":
                pooled = output[bounds[1:] - 1]
            else:
                lengths = (bounds[1:] - bounds[:-1]).unsqueeze(1)
                pooled = torch.zeros(len(lengths), output.shape[1], dtype=torch.float64, device=output.device)
                pooled = pooled.index_add_(0, state["segments"], output.double()) / lengths
            features[start : start + rows, column] = pooled.float().cpu()
            if column == len(layers) - 1:
                raise Done
        return capture

    handles = [net.blocks[layer].resid_post.register_forward_hook(hook(j)) for j, layer in enumerate(layers)]
    try:
        with torch.inference_mode(), tqdm(total=len(ids), unit="text", desc="activations", file=sys.stderr) as bar:
            start = 0
            while start < len(ids):
                stop, total = start, 0
                while stop < len(ids) and (stop == start or total + len(ids[stop]) <= batch_tokens):
                    total += len(ids[stop])
                    stop += 1
                lengths = [len(t) for t in ids[start:stop]]
                batch = ForwardBatch.for_prompts(lengths, device_)
                state.update(rows=stop - start, start=start, bounds=batch.cu_seqlens_q.long(),
                             segments=torch.repeat_interleave(torch.arange(len(lengths), device=device_),
                                                              torch.tensor(lengths, device=device_)))
                flat = torch.tensor([t for seq in ids[start:stop] for t in seq], device=device_)
                try:
                    net(flat, batch)
                except Done:
                    pass
                bar.update(stop - start)
                start = stop
    finally:
        for handle in handles:
            handle.remove()
    return Activations(features, layers, llm.path.name, num_layers, sum(len(t) for t in ids))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m omniscience", description="omniscience: linear probes on the "
                                     "residual stream of models infer runs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = commands.add_parser("train", help="fit a probe from labelled text", description=DESCRIPTION,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, metavar="JSONL",
                   help='training data: one {"text": "...", "label": 0 or 1} object per line (blank lines skipped)')
    p.add_argument("--out", required=True, type=Path, metavar="FILE",
                   help="where to write the probe (.safetensors); with --layers, the best layer's probe")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--layer", type=int, metavar="L", help="the block whose resid_post the probe reads (0-based)")
    which.add_argument("--layers", type=parse_layers, metavar="L1,L2,...|all",
                       help="sweep: fit one probe per layer from a single pass over the data, print each one's "
                            "held-out AUC, and save the best (highest held-out AUC); holds rows x layers x "
                            "hidden floats in memory")
    p.add_argument("--model", default=None, help="HF directory or .gguf file; default: the bundled SmolLM2-135M-Instruct")
    p.add_argument("--pooling", choices=POOLINGS, default="last",
                   help="a text's feature: its last token's residual (default; what a served probe scores at the "
                        "end of a text) or the mean over its tokens")
    p.add_argument("--holdout", type=float, default=0.2, metavar="FRACTION",
                   help="fraction of each class held out for the reported accuracy and AUC (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split (default 0)")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N",
                   help="keep each text's first N tokens (default 256)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="use only the first N rows of --data")
    p.add_argument("--l2", type=float, default=0.1,
                   help="L2 penalty on the standardized weights: loss = mean log loss + l2/2 |w|^2 (default 0.1)")
    p.add_argument("--batch-tokens", type=int, default=2048, metavar="N",
                   help="pack texts into forwards of at most N tokens (default 2048)")
    p.add_argument("--device", default="auto", help="cpu, cuda[:N] or auto (default: cuda if available)")
    p.add_argument("--yaml", type=Path, default=None, metavar="FILE",
                   help="also write a one-entry probe-set YAML (activation sigmoid) naming --out, for --probes")
    p.add_argument("--name", default=None, help="the probe's name in --yaml (default: the stem of --out)")
    return parser


def _check_args(args: argparse.Namespace) -> None:
    if not 0 < args.holdout < 1:
        raise TrainError(f"--holdout must be between 0 and 1 (exclusive); got {args.holdout}")
    for flag in ("max_tokens", "limit", "batch_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise TrainError(f"--{flag.replace('_', '-')} must be >= 1; got {value}")
    if args.layer is not None and args.layer < 0:
        raise TrainError(f"--layer must be >= 0; got {args.layer}")
    if args.l2 < 0:
        raise TrainError(f"--l2 must be >= 0; got {args.l2}")
    if args.out.suffix != ".safetensors":
        raise TrainError(f"--out must end in .safetensors; got {args.out}")
    if args.model is not None and not Path(args.model).expanduser().exists():
        raise TrainError(f"--model {args.model} does not exist")


def train(args: argparse.Namespace) -> None:
    """Read, collect, fit each layer, report, save."""
    _check_args(args)
    examples = read_examples(args.data, args.limit)
    n, positives = len(examples.texts), int(examples.labels.sum())
    train_rows, heldout_rows = split(n, args.holdout, args.seed, examples.labels)
    print(f"[omniscience] {n} examples from {args.data} ({positives} label 1, {n - positives} label 0): "
          f"{len(train_rows)} train, {len(heldout_rows)} held out", file=sys.stderr)
    layers = [args.layer] if args.layer is not None else None if args.layers == "all" else args.layers
    acts = collect_activations(args.model, examples, layers, args.pooling, args.max_tokens, args.batch_tokens,
                               args.device)
    y_train, y_held = examples.labels[train_rows], examples.labels[heldout_rows]
    results = []
    for j, layer in enumerate(acts.layers):
        x = acts.features[:, j]
        probe = fit_logistic(x[train_rows], y_train, l2=args.l2)
        held = probe.predict_proba(x[heldout_rows])
        auc, acc = roc_auc(held, y_held), accuracy(held, y_held)
        train_auc = roc_auc(probe.predict_proba(x[train_rows]), y_train)
        print(f"layer {layer:>3}: held-out AUC {auc:.4f}  accuracy {acc:.4f}  (train AUC {train_auc:.4f})", flush=True)
        results.append((auc, -layer, layer, acc, probe))
    auc, _, layer, acc, probe = max(results, key=lambda r: (r[0], r[3], r[1]))
    if len(results) > 1:
        print(f"best layer: {layer}")
    print(f"held-out accuracy: {acc:.4f} ({len(heldout_rows)} rows)")
    print(f"held-out AUC: {auc:.4f}")
    metadata = {
        "model": acts.model_name, "layer": str(layer), "pooling": args.pooling, "activation": "sigmoid",
        "heldout_auc": f"{auc:.6f}", "heldout_accuracy": f"{acc:.6f}", "n_train": str(len(train_rows)),
        "n_heldout": str(len(heldout_rows)), "holdout": str(args.holdout), "seed": str(args.seed),
        "max_tokens": str(args.max_tokens), "l2": str(args.l2), "data": Path(args.data).name,
        "layers_swept": ",".join(map(str, acts.layers)), "trainer": "python -m omniscience train",
    }
    out = save_probe(args.out, probe.weight, probe.bias, metadata)
    print(f"wrote {out} (layer {layer}, {args.pooling} pooling, {acts.model_name})")
    if args.yaml is not None:
        name = args.name or out.stem
        path = write_probe_yaml(args.yaml, name, layer, out, "sigmoid")
        read_config(path)  # the file the server will read: a bad --name fails here, not at serve time
        print(f"wrote {path} (probe {name!r}: serve with --probes {path})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        train(args)
    except (TrainError, ProbeError) as exc:
        print(f"python -m omniscience {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0
