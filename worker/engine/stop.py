"""Stop strings in streamed text: emit what cannot be the start of one, hold back the rest.

Example:

    >>> matcher = StopMatcher(("END",))
    >>> matcher.feed("the E"), matcher.feed("ND!")
    (('the ', False), ('', True))
"""

from __future__ import annotations


class StopMatcher:
    """Finds stop strings in streamed text, holding back text that may begin one.

    NOTE: the held-back text is always the longest suffix of the output that is a proper prefix
    of some stop string, so a stop string can only start inside it.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = stop
        self._held = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was found)."""
        if not self._stop:
            return delta, False
        text = self._held + delta
        found = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if found:
            self._held = ""
            return text[: min(found)], True
        keep = max((_overlap(text, s) for s in self._stop), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Return the held-back text (generation ended without a stop)."""
        text, self._held = self._held, ""
        return text


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
