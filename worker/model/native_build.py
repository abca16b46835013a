"""The engine's CPU kernels in C (``csrc/*.c``): built with the machine's C compiler on first
use, cached on disk, loaded with ``ctypes``.

Each shared object is compiled for this machine (``-march=native``) and cached under
``PLATFORM_ENGINE_KERNEL_CACHE_DIR`` (default ``~/.cache/platform/kernels``), keyed by its
source, its flags, the compiler, the machine and its CPU's features: a second process loads it
in about a millisecond, and a machine with another CPU builds its own (about 0.2 s each; a
worker starts those builds beside its weight loading, ``prepare_in_background``). The kernels
use OpenMP through the runtime torch has already loaded (torch is imported first), so their
threads are torch's threads. Where there is no C compiler, or a build fails, ``NativeLibrary.get``
returns None once (the reason is logged) and the engine keeps torch's path.

Example:

    >>> DECODE = NativeLibrary("paged_decode", FAST_MATH_FLAGS)
    >>> lib = DECODE.get()  # a ctypes.CDLL, or None without a C compiler
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch  # noqa: F401  (loaded first: the kernels bind to torch's OpenMP runtime)

log = logging.getLogger(__name__)

T = TypeVar("T")

CSRC = Path(__file__).with_name("csrc")
COMMON_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC")
# vectorised exp (glibc's libmvec) and reassociated sums; the source must not rely on inf/NaN
FAST_MATH_FLAGS = (*COMMON_FLAGS, "-ffast-math")
# every product and sum rounded as written, as torch's own ops round them
EXACT_FLAGS = (*COMMON_FLAGS, "-ffp-contract=off")
# NOTE: linked apart from compiling, without -ffast-math: linked with it, the library would
# carry crtfastmath.o, which turns on flush-to-zero for the whole process when it is loaded
# (subnormals become 0 in torch and Python too)
LINK_FLAGS = ("-shared", "-fopenmp")
BUILD_TIMEOUT_S = 120.0


def cache_dir() -> Path:
    explicit = os.environ.get("PLATFORM_ENGINE_KERNEL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "platform" / "kernels"


def _cpu_features() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "features", "cpu part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


class NativeLibrary:
    """One C source, built once per machine and loaded once per process (thread-safe)."""

    def __init__(self, name: str, flags: tuple[str, ...]) -> None:
        self.name = name
        self.source = CSRC / f"{name}.c"
        self.flags = flags
        self._lock = threading.Lock()
        self._loaded = False
        self._library: ctypes.CDLL | None = None
        # what bind() made of the loaded library (forget() drops both)
        self._bound: Any = None

    def path(self, compiler: str) -> Path:
        """Where this source built by ``compiler`` for this machine is cached."""
        key = hashlib.sha256()
        flags = " ".join((*self.flags, "|", *LINK_FLAGS))
        # the headers the sources include count as source
        headers = b"".join(path.read_bytes() for path in sorted(CSRC.glob("*.h")))
        for part in (self.source.read_bytes(), headers, flags.encode(), compiler.encode()):
            key.update(part)
            key.update(b"\0")
        key.update(f"{platform.machine()}\0{_cpu_features()}".encode())
        return cache_dir() / f"{self.name}-{key.hexdigest()[:20]}.so"

    def build(self) -> Path:
        """Compile for this machine unless cached; returns the shared object's path.

        Raises ``RuntimeError`` with the compiler's message when it cannot be built.
        """
        compiler = os.environ.get("CC") or "cc"
        path = self.path(compiler)
        if path.exists():
            return path
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C compiler ({compiler!r} is not on PATH)")
        path.parent.mkdir(parents=True, exist_ok=True)
        # built beside its final name, then renamed: processes building at once never see half
        # a file
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        obj = tmp[: -len(".so")] + ".o"
        try:
            for cmd in (
                [compiler, *self.flags, "-c", "-o", obj, str(self.source)],
                [compiler, *LINK_FLAGS, "-o", tmp, obj, "-lm"],
            ):
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp, path)
        finally:
            for leftover in (tmp, obj):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        return path

    def get(self) -> ctypes.CDLL | None:
        """The loaded library, built if needed; None (logged once) where it cannot be."""
        with self._lock:
            if not self._loaded:
                self._library = self._load()
                self._loaded = True
            return self._library

    def bind(self, wrap: Callable[[ctypes.CDLL], T]) -> T | None:
        """``wrap(library)``, made once per loaded library; None where it cannot be loaded."""
        library = self.get()
        if library is None:
            return None
        with self._lock:
            if self._bound is None:
                self._bound = wrap(library)
            return cast(T, self._bound)

    def forget(self) -> None:
        """Load again on the next ``get()`` (tests change the compiler or the cache)."""
        with self._lock:
            self._loaded, self._library, self._bound = False, None, None

    def _load(self) -> ctypes.CDLL | None:
        try:
            path = self.build()
            library = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("CPU kernel %s unavailable, using torch's path: %s", self.name, exc)
            return None
        log.info("CPU kernel %s: %s", self.name, path)
        return library


def prepare_in_background(*libraries: NativeLibrary) -> None:
    """Build (or find) ``libraries`` on a thread: the compiler is a child process, so the builds
    run beside whatever this process does next (a worker loads its weights)."""

    def build_all() -> None:
        for library in libraries:
            library.get()

    threading.Thread(target=build_all, name="cpu-kernel-build", daemon=True).start()
