"""Compile a C kernel of this folder for the CPU it runs on, once, and load it with ctypes.

The library is built with the system C compiler (`$CC`, else `cc`) at `-O3 -march=native -fopenmp`, without
-ffast-math (the kernels rely on float32 evaluation order for batch invariance). It is cached under
~/.cache/layerzero/native, keyed by the source and the headers beside it, the flags, the compiler and the CPU's
feature flags, so a home shared by different machines builds one library per CPU. A build takes about a second;
failure (no compiler, a compile error) is reported as `NativeBuildError` with the compiler's message, and the
backend is then unavailable with that reason. OpenMP resolves to the libgomp torch has already loaded (same soname), so the
kernels share torch's thread pool rather than oversubscribing the cores with a second one.

`calls_into(sink)` also appends each kernel call made inside it (the ctypes function and its arguments) to `sink`:
what a CPU decode graph (infer/runners/cpu_graphs.py) replays.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (loads torch's libgomp before any kernel library asks for it)

HERE = Path(__file__).parent
CACHE_DIR = Path("~/.cache/layerzero/native")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")
Call = tuple[Callable[..., Any], tuple[Any, ...]]  # a kernel call as made: (ctypes function, arguments)
_recording = threading.local()  # .sinks: this thread's calls_into lists; the innermost gets each call


class NativeBuildError(RuntimeError):
    """A kernel library could not be compiled or loaded."""


@functools.cache
def cpu_flags() -> str:
    """This CPU's feature flags (/proc/cpuinfo's line; elsewhere the processor's name)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def vector_isa() -> str:
    """The vector form the linear tiles build in here (`-march=native`): "AVX-512", "AVX2" (AVX2 with FMA) or "plain C"."""
    flags = cpu_flags()
    if " avx512f" in flags:
        return "AVX-512"
    return "AVX2" if " avx2" in flags and " fma" in flags else "plain C"


def _compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise NativeBuildError(f"no C compiler: {cc!r} is not on PATH (set CC to one)")
    return cc


def library_path(source: Path, cc: str, extra: tuple[str, ...] = ()) -> Path:
    """Where the library built from `source` (and the headers beside it) with these flags on this CPU lives."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    texts = [source.read_text(), *(header.read_text() for header in sorted(source.parent.glob("*.h")))]
    key = hashlib.sha256("\0".join([*texts, *FLAGS, *extra, cc, *version, cpu_flags()]).encode())
    return CACHE_DIR.expanduser() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def build(source: Path, extra: tuple[str, ...] = ()) -> Path:
    """Compile `source` into the cache (if not there yet) and return the library's path."""
    cc = _compiler()
    target = library_path(source, cc, extra)
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            partial = Path(tmp.name)
    except OSError as exc:
        raise NativeBuildError(f"cannot write the kernel cache {target.parent}: {exc}") from exc
    done = subprocess.run([cc, *FLAGS, *extra, str(source), "-o", str(partial)], capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise NativeBuildError(f"{cc} could not compile {source.name}: {done.stderr.strip()[-2000:]}")
    os.replace(partial, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


@functools.cache
def load(name: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The compiled library of `name`.c in this folder (built on first use)."""
    try:
        return ctypes.CDLL(str(build(HERE / f"{name}.c", extra)))
    except OSError as exc:
        raise NativeBuildError(f"could not load the {name} library: {exc}") from exc


@functools.cache
def kernel(name: str, symbol: str, argtypes: tuple[type, ...], restype: type | None = None,
           extra: tuple[str, ...] = ()) -> Callable[..., Any]:
    """A caller of function `symbol` of library `name`, with its C signature declared (ctypes then converts Python
    ints); the caller also reports each call to `calls_into`. Each signature gets its own function object (indexing,
    unlike attribute access, does not share one), so declaring a signature here never changes another caller's."""
    fn = load(name, extra)[symbol]
    fn.argtypes, fn.restype = list(argtypes), restype

    def call(*args: Any) -> Any:
        sinks = getattr(_recording, "sinks", None)
        if sinks:
            sinks[-1].append((fn, args))
        return fn(*args)

    call.__name__ = symbol
    return call


def record_call(fn: Callable[..., Any], *args: Any) -> None:
    """Report a call that is not a C kernel but must run again, in order, in a replay of what `calls_into` records
    (a collective): its Python function and arguments."""
    sinks = getattr(_recording, "sinks", None)
    if sinks:
        sinks[-1].append((fn, args))


@contextlib.contextmanager
def calls_into(sink: list[Call]) -> Iterator[list[Call]]:
    """Append every kernel call this thread makes inside the block to `sink`, in order, as well as making it. The
    arguments are what C got (pointers as ints): a replay is valid while the memory they point to is."""
    sinks = getattr(_recording, "sinks", None)
    if sinks is None:
        sinks = _recording.sinks = []
    sinks.append(sink)
    try:
        yield sink
    finally:
        sinks.pop()
