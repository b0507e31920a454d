"""`infer export-tokenizer DIR`: the tokenizer that clients which tokenize locally load instead of a hub download."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    """`infer export-tokenizer DIR`: the model's tokenizer and chat template as a Hugging Face tokenizer folder."""
    from infer.families.chat_template import chat_template_name
    from infer.loader.model_path import resolve_model_path
    from infer.loader.model_loader import read_config
    from infer.loader.tokenizer import Tokenizer
    from infer.families.chat_template import ChatTemplateError, load_template_file, template_source

    path = resolve_model_path(args.model)
    tokenizer = Tokenizer.from_path(path)
    if args.chat_template is not None:
        load_template_file(args.chat_template)  # ChatTemplateError (a ValueError) names the file and the line
        template = Path(args.chat_template).expanduser().read_text()
    else:
        try:
            template = template_source(chat_template_name(read_config(path).model_type, tokenizer))
        except ChatTemplateError:
            template = None  # a base model: no chat template to ship
    hf = tokenizer.to_transformers()
    hf.chat_template = template
    written = hf.save_pretrained(args.directory)
    print(f"[infer] wrote {', '.join(sorted(Path(f).name for f in written))} to {args.directory}", file=sys.stderr)
    return 0
