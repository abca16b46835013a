"""`python -m loader.hf_transfer_child`: one `hf_transfer.download`, in its own process.

hf_transfer holds the GIL for a whole download (measured with hf_transfer 0.1.9: a thread
ticking every 10 ms stalled for the 11.9 s of a 200 MB download), which would starve the
worker's heartbeat and get it declared dead. So the loader runs it here. The arguments come
as one JSON object on stdin (headers may carry a token: never in argv); exit status 0 means
the file is complete, anything else comes with the reason on stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the loading process goes away (no orphaned downloads)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main() -> int:
    _die_with_parent()
    args = json.load(sys.stdin)
    import hf_transfer

    try:
        hf_transfer.download(
            url=args["url"],
            filename=args["filename"],
            max_files=args["max_files"],
            chunk_size=args["chunk_size"],
            parallel_failures=args["parallel_failures"],
            max_retries=args["max_retries"],
            headers=args["headers"] or None,
        )
    except Exception as exc:  # hf_transfer raises plain Exceptions carrying the HTTP error
        print(str(exc)[:500], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
