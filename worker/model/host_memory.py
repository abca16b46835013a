"""How the process's C allocator treats the CPU path's large, short-lived tensors.

A CPU forward step allocates and frees megabytes of intermediates per layer (a 1024-token
chunk's MLP activations are 12 MB). With glibc's defaults each such buffer is a fresh ``mmap``
(above 128 KB, until its dynamic threshold catches up) or heap memory trimmed back to the
kernel once freed, so every step pays page faults to get it back: 6-8% of a CPU run's time on
the engine benchmark. Keeping freed memory in the process (the trim threshold raised, buffers
up to 32 MB from the heap) removes them; the process's peak RSS is unchanged (it is reached
by the same buffers either way). vLLM asks its CPU users to preload tcmalloc for the same
reason.

Example:

    >>> keep_freed_memory()  # True where glibc took the settings
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform

log = logging.getLogger(__name__)

# mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
# glibc's ceiling for the mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
_MMAP_THRESHOLD_BYTES = 32 << 20
# freed heap memory kept before any is returned: more than a step's intermediates
_TRIM_THRESHOLD_BYTES = 1 << 30
# the heap grows by at least this much at once (fewer brk calls)
_TOP_PAD_BYTES = 64 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set the allocator up as the module doc says (once per process; glibc only)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    # NOTE: glibc's soname; ctypes.util.find_library would run ldconfig (tens of ms)
    libc = ctypes.CDLL("libc.so.6")
    ok = all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES),
            (_M_TOP_PAD, _TOP_PAD_BYTES),
        )
    )
    if not ok:
        log.warning("mallopt refused a setting; CPU steps may pay page faults")
    return ok
