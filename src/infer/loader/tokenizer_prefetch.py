"""An HF directory's tokenizer, read by a child process while the engine core imports torch and loads the weights.

transformers' AutoTokenizer reads such a directory; in a process that has imported torch its imports take 3-7 s (the
generation stack and torch.compile's come with them), which the core paid after its own imports and weights. The
child is a fresh interpreter, started before the core imports torch, in which torch is hidden
(`sys.modules["torch"] = None`: transformers takes it for absent and imports its tokenizer code alone, ~2-3 s; a
tokenizer needs no torch). It hands back the pickled `Tokenizer` (its backend as JSON, special tokens, chat template).
Where it cannot, `result()` reads the tokenizer in this process: the same tokenizer, or the same error. A .gguf's
vocabulary is read without transformers, in milliseconds: it is not prefetched. Measured: docs/loaders.md."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from infer.loader.tokenizer import Tokenizer

CHILD_TIMEOUT_S = 300.0  # past it the child is stopped and the tokenizer read here

_CHILD = """
import json, pickle, sys
sys.path[:0] = json.loads(sys.argv[2])
sys.modules["torch"] = None
from pathlib import Path
from infer.loader.tokenizer import Tokenizer
try:
    data = pickle.dumps(Tokenizer.from_hf_dir(Path(sys.argv[1])))
except Exception:
    sys.exit(1)  # quietly: the core reads the directory itself and reports the error once
sys.stdout.buffer.write(data)
"""


class TokenizerPrefetch:
    """The tokenizer of `path`, being read by a child process from construction on (HF directories only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.from_child = False  # whether result() gave the child's tokenizer
        self._child: subprocess.Popen[bytes] | None = None
        if path.is_dir():
            env = os.environ | {"TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}  # not "PyTorch was not found"
            try:
                self._child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), json.dumps(sys.path)],
                                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)
            except OSError:  # no child: read here
                self._child = None

    def result(self) -> Tokenizer:
        """The tokenizer: the child's, or read here where the child failed (its error, if any, is raised here)."""
        if self._child is not None:
            try:
                out, _ = self._child.communicate(timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._child.kill()
                out, _ = self._child.communicate()
            child, self._child = self._child, None
            if child.returncode == 0:
                try:
                    tokenizer = pickle.loads(out)
                except Exception:  # noqa: BLE001  (a torn write: read it here instead)
                    tokenizer = None
                if isinstance(tokenizer, Tokenizer):
                    self.from_child = True
                    return tokenizer
        return Tokenizer.from_path(self.path)

    def cancel(self) -> None:
        """Stop the child, if it still runs (the core failed before it needed the tokenizer)."""
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None
