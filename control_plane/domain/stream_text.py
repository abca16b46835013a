"""What a stream's client holds of a job's text, and what it must be sent next (pure).

A job's event stream carries its text as deltas, and may carry more than one attempt's: a job
whose worker died is run again from the start (a new `running` event, a new attempt), while
deltas of the lost attempt may still arrive. Deltas can also be lost: the worker streams them
best effort, so a Redis restart drops the ones written meanwhile. The text is whole only in
the job's stored output, which its terminal event carries.

`StreamText` keeps the client's text true to that output whatever happened, with as little as
it can tell the client:

- deltas of an attempt older than the newest seen are dropped;
- a new attempt's text is held back while it repeats what the client already has (a greedy
  or seeded job retried reproduces it), and only what goes beyond is sent: the client sees
  one text, as if nothing happened;
- when a new attempt's text departs from what the client has, the client is told to discard
  its text (`Restart`, the SSE event `restarted`), then sent the new attempt's text from its
  start;
- a delta that does not start where the attempt's text so far ends (its `offset`) means some
  were lost: the attempt's later deltas are held back, and the end fills the client's text
  in from the stored output;
- at the end, the client's text is compared with the output: what is missing is sent, and a
  text that the output does not continue is restarted with the whole output.

So the client's text, with every `Text` appended and every `Restart` clearing it, always ends
as the job's output. An OpenAI stream cannot restart: it ends with an error on a `Restart`.

Example:
    >>> s = StreamText()
    >>> s.running(1); s.delta("Hel", 1, 0) + s.delta("lo", 1, 3)
    [Text(text='Hel'), Text(text='lo')]
    >>> s.running(2); s.delta("Hello", 2, 0) + s.delta(" you", 2, 5)  # a retry reproduces it
    [Text(text=' you')]
    >>> s.end("Hello you!")
    [Text(text='!')]
"""

from __future__ import annotations

from dataclasses import dataclass

# Why the client must discard its text.
NEW_ATTEMPT = "new_attempt"  # the job is run again and its new text differs from what was sent
EVENTS_LOST = "events_lost"  # deltas were lost and the output does not continue what was sent


@dataclass(frozen=True, slots=True)
class Text:
    """Append `text` to the client's text."""

    text: str


@dataclass(frozen=True, slots=True)
class Restart:
    """The client discards its text; what follows starts the job's text anew."""

    attempt: int  # the attempt whose text follows
    reason: str  # NEW_ATTEMPT | EVENTS_LOST


Step = Text | Restart


class StreamText:
    """The text a stream's client holds (`sent`), and the attempt being followed."""

    def __init__(self) -> None:
        self.sent = ""  # the client's text: every Text sent since the last Restart
        self.attempt = 0  # the newest attempt seen
        self._current = ""  # that attempt's text as received, contiguous from its start
        self._gap = False  # a delta of that attempt was lost: the rest waits for the end

    def running(self, attempt: int) -> None:
        """A `running` event: from a newer attempt on, its deltas are the ones followed."""
        if attempt > self.attempt:
            self.attempt = attempt
            self._current, self._gap = "", False

    def delta(self, text: str, attempt: int | None, offset: int | None) -> list[Step]:
        """An `output` event's delta, of `attempt` (None: the newest seen), starting at
        `offset` characters into that attempt's text (None: not said; taken as contiguous)."""
        if attempt is None:
            attempt = self.attempt
        if attempt < self.attempt:
            return []  # a lost attempt's late delta
        self.running(attempt)
        if self._gap:
            return []
        if offset is not None and offset != len(self._current):
            # before it: a repeat of text held already; past it: deltas were lost
            self._gap = offset > len(self._current)
            return []
        self._current += text
        return self._catch_up()

    def _catch_up(self) -> list[Step]:
        """Send what the followed attempt's text adds to the client's, if it continues it."""
        current = self._current
        if current.startswith(self.sent):
            return self._send(current[len(self.sent) :])
        if self.sent.startswith(current):
            return []  # a new attempt that, so far, repeats what the client has
        return self._restart(current, NEW_ATTEMPT)

    def end(self, output: str | None) -> list[Step]:
        """The job ended; `output`: its stored text (None: it did not succeed, and the terminal
        event says so). What the client's text still lacks, or a restart with all of it."""
        if output is None:
            return []
        if output.startswith(self.sent):
            return self._send(output[len(self.sent) :])
        reason = EVENTS_LOST if self._current.startswith(self.sent) else NEW_ATTEMPT
        return self._restart(output, reason)

    def _send(self, text: str) -> list[Step]:
        if not text:
            return []
        self.sent += text
        return [Text(text)]

    def _restart(self, text: str, reason: str) -> list[Step]:
        self.sent = ""
        return [Restart(self.attempt, reason), *self._send(text)]
