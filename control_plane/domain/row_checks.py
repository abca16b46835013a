"""When a caller that waits for a job's end through Redis reads the job's row instead (pure).

A job's end reaches the callers that wait for it (a sync call, an SSE stream) through Redis,
published after the commit (`services/jobs/finish.py`). That publish can be lost: Redis is
down or restarting when the job ends ("could not publish the end of N jobs"), or the API
process that ended the job dies between its commit and its publish. The row is the truth, so
a waiting caller reads it:

- after a Redis failure it saw, every AFTER_FAILURE_S, until it has read the row once after
  Redis answered again: any end lost in the outage is in the row by then, and a later end is
  published as usual;
- otherwise every EVERY_S: an end lost where this caller saw no failure (a publisher killed
  after its commit; the publisher's own connection failing).

Why the waiting side and not a publish repeated once Redis is back: the row needs nothing
but a primary-key read, and covers a publisher that died with what it failed to send; the
publisher would have to survive and remember it. The cost is one read per waiting caller every
EVERY_S while it waits, and only while its events are silent (a stream's deltas are proof
enough that Redis works).
"""

from __future__ import annotations

# Between reads of the row while Redis has failed and not yet been seen to answer again: the
# bound on how late a lost end reaches its caller after an outage.
AFTER_FAILURE_S = 1.0
# Between reads otherwise: the bound for an end lost without a failure the caller could see.
EVERY_S = 5.0


class RowChecks:
    """One waiting caller's schedule of row reads; times are `time.monotonic()` seconds."""

    def __init__(self, now: float) -> None:
        self._last = now  # the last read (or the start of the wait)
        self._failed = False  # Redis failed since the last read that followed an answer
        self._answered = False  # Redis answered since that failure

    def redis(self, *, ok: bool) -> None:
        """The outcome of one of the caller's reads of Redis."""
        if not ok:
            self._failed, self._answered = True, False
        elif self._failed:
            self._answered = True

    def due(self, now: float) -> bool:
        return now - self._last >= (AFTER_FAILURE_S if self._failed else EVERY_S)

    def read(self, now: float) -> None:
        """The row was read (and the job had not ended)."""
        self._last = now
        if self._answered:  # read after Redis came back: nothing lost remains to be found
            self._failed = self._answered = False
