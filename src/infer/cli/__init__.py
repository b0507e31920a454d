"""The `infer` command line (`infer generate`, `infer serve`, `infer export-tokenizer`): the parser in `parser.py`,
the flags the commands share in `flags.py`, a module per command. Heavy imports stay inside the commands, so
`infer --help` and a node-0 launch import no torch (tests/unit/test_import_rules.py)."""

from __future__ import annotations

import sys

from infer.cli.parser import build_parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a ValueError or FileNotFoundError is printed as `infer: error: ...`, exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"infer: error: {exc}", file=sys.stderr)
        return 2
