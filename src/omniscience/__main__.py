"""`python -m omniscience train ...`: see omniscience/cli.py (`--help` lists every flag)."""

import sys

from omniscience.cli import main

if __name__ == "__main__":
    sys.exit(main())
