"""The CPU decode-attention kernel (``csrc/paged_decode.c``): built with the machine's C compiler
on first use, cached on disk, called through ``ctypes``.

Why C: a decode step's attention on CPU in torch gathers every sequence's blocks into a scratch
buffer and runs SDPA over it, so each cached key and value crosses memory three times (read,
write, read again), padding included; the kernel reads them once, in place, from the paged
cache (vLLM's CPU backend does the same with its C++ kernels). Prompts keep torch's SDPA: there
the work is matrix products, which torch already does well.

The shared object is compiled for this machine (``-march=native``) and cached under
``PLATFORM_ENGINE_KERNEL_CACHE_DIR`` (default ``~/.cache/platform/kernels``), keyed by the
source, the flags, the compiler, the machine and its CPU's features: a second process loads it in
about a millisecond, and a machine with another CPU builds its own (about 0.2 s; a worker starts
that build beside its weight loading, ``prepare_in_background``). It uses OpenMP through the
runtime torch has already loaded (torch is imported first), so its threads are torch's threads.
Where there is no C compiler, or the build fails, ``load()`` returns None once (the reason is
logged) and the engine keeps torch's path.

Example:

    >>> prepare_in_background()  # at process start: the build overlaps other start-up work
    >>> kernel = load()  # None without a C compiler
    >>> kernel.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, window, out)
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
# -ffast-math: the vectorised exp and reassociated sums (the source never relies on inf/NaN)
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared")
BUILD_TIMEOUT_S = 120.0

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


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


def library_path(compiler: str) -> Path:
    """Where the kernel built by ``compiler`` for this machine is cached."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), compiler.encode()):
        key.update(part)
        key.update(b"\0")
    key.update(f"{platform.machine()}\0{_cpu_features()}".encode())
    return cache_dir() / f"paged_decode-{key.hexdigest()[:20]}.so"


class DecodeKernel:
    """The loaded kernel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fn = ctypes.CDLL(str(path)).paged_decode_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [
            *(_P, _I64, _P, _P, _P, _I64, _P, _P),
            *(_I64, _I64, _I64, _I64, _I64),
            ctypes.c_float,
            _I64,
            ctypes.c_int,
        ]

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (
            q.device.type == "cpu"
            and q.dtype == torch.float32
            and k_cache.dtype == torch.float32
            and q.stride(2) == 1
            and q.stride(1) == q.shape[2]
            and k_cache.is_contiguous()
        )

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        window: int | None,
        out: torch.Tensor,
    ) -> None:
        """One new token per sequence: ``out[i] = attention(q[i], its cached keys/values)``.

        q: [n, Hq, D] float32, heads contiguous (rows may be apart: a view of a fused
        projection); out: [n, Hq, D] contiguous; caches: [num_blocks, block_size, Hkv, D];
        block_tables: [n, max_blocks] int32 (rows contiguous); seq_lens: [n] int32 (>= 1).
        """
        n, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        # NOTE: the C code trusts these; a wrong stride or dtype would read out of bounds
        assert out.shape == q.shape and out.is_contiguous() and v_cache.shape == k_cache.shape
        assert v_cache.is_contiguous() and block_tables.dtype == seq_lens.dtype == torch.int32
        assert block_tables.shape[0] == n == seq_lens.shape[0] and block_tables.stride(1) == 1
        assert seq_lens.is_contiguous() and num_heads % num_kv_heads == 0
        assert self.supports(q, k_cache)
        status = self._fn(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            block_tables.data_ptr(),
            block_tables.stride(0),
            seq_lens.data_ptr(),
            out.data_ptr(),
            n,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale,
            window or 0,
            torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("paged decode attention: out of memory for its score buffers")


def build(compiler: str | None = None) -> Path:
    """Compile the kernel for this machine unless cached; returns the shared object's path.

    Raises ``RuntimeError`` with the compiler's message when it cannot be built.
    """
    compiler = compiler or os.environ.get("CC") or "cc"
    path = library_path(compiler)
    if path.exists():
        return path
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler ({compiler!r} is not on PATH)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # built beside its final name, then renamed: processes building at once never see half a file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        cmd = [compiler, *CFLAGS, "-o", tmp, str(SOURCE), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_LOCK = threading.Lock()


def load() -> DecodeKernel | None:
    """The kernel, built if needed; None (logged once) where it cannot be built or loaded."""
    with _LOCK:
        return _load_once()


def forget() -> None:
    """Load again on the next ``load()`` (tests change the compiler or the cache directory)."""
    with _LOCK:
        _load_once.cache_clear()


def prepare_in_background() -> None:
    """Build (or find) the kernel on a thread: the compiler is a child process, so the build
    runs beside whatever this process does next (a worker loads its weights)."""
    threading.Thread(target=load, name="decode-kernel-build", daemon=True).start()


@functools.cache
def _load_once() -> DecodeKernel | None:
    try:
        path = build()
        kernel = DecodeKernel(path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("CPU decode-attention kernel unavailable, using torch's path: %s", exc)
        return None
    log.info("CPU decode-attention kernel: %s", path)
    return kernel
