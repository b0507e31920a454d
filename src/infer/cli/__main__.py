"""`python -m infer.cli`: the `infer` command."""

import sys

from infer.cli import main

sys.exit(main())
