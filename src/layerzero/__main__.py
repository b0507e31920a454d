"""`python -m layerzero doctor | kernels [OP] | readiness` (add --json for machine-readable output)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; readiness exits 1 when a check fails."""
    parser = argparse.ArgumentParser(prog="python -m layerzero", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="hardware, libraries, backends with reasons, kernels, policy")
    kernels = sub.add_parser("kernels", help="registered kernels (of one op) with their availability")
    kernels.add_argument("op", nargs="?")
    sub.add_parser("readiness", help="production readiness checks")
    for command in sub.choices.values():
        command.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)

    if args.command == "doctor":
        from layerzero.tools.doctor import doctor

        doctor(as_json=args.json)
        return 0
    if args.command == "kernels":
        from layerzero.tools.inspect import list_kernels

        found = list_kernels(args.op)
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            for k in found:
                state = "available" if k["available"] else f"unavailable {k['unavailable_reason']['code']}"
                print(f"{k['op']:<20} {k['kernel_id']:<40} priority {k['priority']:<4} {state}")
        return 0
    from layerzero.tools.readiness import readiness_check

    report = readiness_check()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
