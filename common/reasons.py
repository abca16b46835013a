"""Why a worker or a job failed, as users read it: whole, within one generous bound.

Shared by the worker (which reports its failure's reason) and the control plane (which stores
it and shows it, e.g. in a crash loop's error): a reason names what failed (an exception's
type and message, a URI, a tensor) and users need all of it to act, so it is kept whole up to
MAX_REASON_CHARS, far beyond any real message, and cut only past that, visibly.
"""

from __future__ import annotations

# A failure's reason as stored (`workers.reason`) and shown. A loader error naming a URI of
# ~1,000 characters (uris.MAX_URI_CHARS is 2,000) and a tensor still fits, with its type.
MAX_REASON_CHARS = 4_000
CUT_MARK = " …(cut)"


def bounded_reason(text: str) -> str:
    """`text` whole when it fits MAX_REASON_CHARS, else its start and CUT_MARK (same bound)."""
    if len(text) <= MAX_REASON_CHARS:
        return text
    return text[: MAX_REASON_CHARS - len(CUT_MARK)] + CUT_MARK


__all__ = ["CUT_MARK", "MAX_REASON_CHARS", "bounded_reason"]
