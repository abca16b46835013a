"""What a stream's client is sent of a job's text (`domain/stream_text.py`): whatever the event
stream carried (attempts, late deltas of a lost attempt, lost deltas), the client's text ends
as the job's output, and it is told to restart only when the text it holds cannot be continued.
And when a waiting caller reads its job's row for an end Redis lost (`domain/row_checks.py`).
"""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from control_plane.domain import stream_text
from control_plane.domain.row_checks import AFTER_FAILURE_S, EVERY_S, RowChecks
from control_plane.domain.stream_text import (
    EVENTS_LOST,
    NEW_ATTEMPT,
    Restart,
    Step,
    StreamText,
    Text,
)


def client_text(steps: list[Step]) -> str:
    """What a client holds after these steps (a Restart clears it)."""
    out = ""
    for step in steps:
        out = out + step.text if isinstance(step, Text) else ""
    return out


def feed(s: StreamText, attempt: int, text: str, pieces: list[int], offset: int = 0) -> list[Step]:
    """`text` as deltas of `attempt` cut at `pieces` lengths, from `offset`."""
    steps: list[Step] = []
    at = offset
    for n in pieces:
        piece = text[at : at + n]
        steps += s.delta(piece, attempt, at)
        at += n
    return steps


def test_the_module_example_holds() -> None:
    assert doctest.testmod(stream_text).failed == 0


def test_one_attempt_streams_as_it_comes() -> None:
    s = StreamText()
    s.running(1)
    assert feed(s, 1, "Hello", [2, 3]) == [Text("He"), Text("llo")]
    assert s.end("Hello") == []


def test_a_retry_that_repeats_the_text_is_seamless() -> None:
    s = StreamText()
    s.running(1)
    steps = feed(s, 1, "Once upon", [4, 5])
    s.running(2)
    steps += feed(s, 2, "Once upon a time", [2, 2, 5, 7])
    assert steps == [Text("Once"), Text(" upon"), Text(" a time")]
    assert not any(isinstance(x, Restart) for x in steps)


def test_a_retry_that_departs_restarts_the_client_with_the_new_text() -> None:
    s = StreamText()
    s.running(1)
    steps = feed(s, 1, "Once upon", [4, 5])
    s.running(2)
    steps += feed(s, 2, "Once there", [4, 6])
    assert steps[-2:] == [Restart(2, NEW_ATTEMPT), Text("Once there")]
    steps += s.end("Once there")
    assert client_text(steps) == "Once there"


def test_late_deltas_of_a_lost_attempt_are_dropped() -> None:
    s = StreamText()
    s.running(1)
    steps = s.delta("A", 1, 0)
    s.running(2)
    steps += s.delta("X", 1, 1)  # the first worker, not yet dead, streams on
    steps += s.delta("A", 2, 0) + s.delta("B", 2, 1)
    assert client_text(steps + s.end("AB")) == "AB"
    assert not any(isinstance(x, Restart) for x in steps)


def test_a_delta_of_a_new_attempt_without_its_running_event_switches_to_it() -> None:
    s = StreamText()
    steps = s.delta("abc", 1, 0) + s.delta("abd", 2, 0)  # attempt 2's `running` was lost
    assert s.attempt == 2 and steps[-2:] == [Restart(2, NEW_ATTEMPT), Text("abd")]


def test_lost_deltas_are_filled_in_from_the_output() -> None:
    s = StreamText()
    s.running(1)
    steps = s.delta("The ", 1, 0)
    steps += s.delta("end", 1, 8)  # "wee " (4..8) was lost: held back from here on
    assert steps == [Text("The ")]
    assert s.end("The wee end") == [Text("wee end")]


def test_deltas_without_offsets_that_lost_some_restart_at_the_end() -> None:
    """Deltas of a worker that does not say their offsets: a gap shows only at the end."""
    s = StreamText()
    steps = s.delta("The ", None, None) + s.delta("end", None, None)
    steps += s.end("The wee end")
    assert steps[-2:] == [Restart(0, EVENTS_LOST), Text("The wee end")]


def test_a_repeated_delta_is_not_sent_twice() -> None:
    s = StreamText()
    assert s.delta("ab", 1, 0) + s.delta("ab", 1, 0) + s.delta("c", 1, 2) == [
        Text("ab"),
        Text("c"),
    ]


def test_a_job_that_did_not_succeed_is_not_repaired() -> None:
    s = StreamText()
    s.delta("partial", 1, 0)
    assert s.end(None) == []


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[str, int | None, int | None]], str]:
    """Event streams of one job: attempts (the last one's text is the output; a retry often
    repeats a prefix of the text before it), each cut into deltas, some lost, some late ones of
    an earlier attempt interleaved."""
    alphabet = st.sampled_from("ab ")
    n_attempts = draw(st.integers(1, 3))
    texts: list[str] = []
    for _ in range(n_attempts):
        base = texts[-1] if texts and draw(st.booleans()) else ""
        keep = draw(st.integers(0, len(base)))
        texts.append(base[:keep] + draw(st.text(alphabet, max_size=8)))
    events: list[tuple[str, int | None, int | None]] = []
    for attempt, text in enumerate(texts, start=1):
        at = 0
        while at < len(text):
            n = draw(st.integers(1, len(text) - at))
            if draw(st.integers(0, 5)) != 0:  # one in six lost
                events.append((text[at : at + n], attempt, at))
            if attempt > 1 and draw(st.integers(0, 4)) == 0:  # a late one of the attempt before
                events.append((draw(st.text(alphabet, min_size=1, max_size=3)), attempt - 1, 0))
            at += n
    return events, texts[-1]


@given(histories())
def test_the_client_always_ends_with_the_output(
    history: tuple[list[tuple[str, int | None, int | None]], str],
) -> None:
    events, output = history
    s = StreamText()
    steps: list[Step] = []
    for text, attempt, offset in events:
        steps += s.delta(text, attempt, offset)
    steps += s.end(output)
    assert client_text(steps) == output
    assert s.end(output) == [], "a second end adds nothing"


@given(st.text("ab ", max_size=12), st.lists(st.integers(1, 4), max_size=12))
def test_one_attempt_without_losses_never_restarts(text: str, cuts: list[int]) -> None:
    s = StreamText()
    s.running(1)
    steps: list[Step] = []
    at = 0
    for n in [*cuts, len(text)]:
        if at >= len(text):
            break
        steps += s.delta(text[at : at + n], 1, at)
        at += n
    steps += s.end(text)
    assert all(isinstance(x, Text) for x in steps) and client_text(steps) == text


def test_a_waiting_caller_reads_the_row_every_few_seconds_and_each_second_after_a_failure() -> None:
    checks = RowChecks(0.0)
    assert not checks.due(EVERY_S - 0.1) and checks.due(EVERY_S)
    checks.read(EVERY_S)
    checks.redis(ok=False)  # an outage: the end may be lost
    assert checks.due(EVERY_S + AFTER_FAILURE_S)
    checks.read(EVERY_S + AFTER_FAILURE_S)
    assert checks.due(EVERY_S + 2 * AFTER_FAILURE_S), "still every second while it fails"
    checks.redis(ok=True)  # Redis is back
    checks.read(EVERY_S + 2 * AFTER_FAILURE_S)  # a read after that: whatever was lost, found
    assert not checks.due(EVERY_S + 3 * AFTER_FAILURE_S)
    assert checks.due(2 * EVERY_S + 2 * AFTER_FAILURE_S)
