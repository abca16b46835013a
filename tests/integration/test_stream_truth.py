"""A stream's text is the job's output, whatever its event stream carried: a raw SSE client, the
SDK's Stream and the OpenAI client's stream each end with the job's exact output or with an
explicit error naming the job, never with another text.

- a worker lost mid-job: the retry's text is held back while it repeats what was streamed
  (one seamless text), or, when it departs, the SSE stream says `restarted` (the SDK raises
  StreamRestarted with the job; the OpenAI stream ends with an error chunk naming the job)
  and late deltas of the lost attempt are dropped: never attempt 1's partial text followed
  by attempt 2's;
- deltas lost (as in a Redis restart) while the job still succeeds: filled in from the stored
  output, never a short text with a success ending.

Two API processes' apps served over real HTTP (tests/integration/stream_helpers.py); the
worker's part is driven from the test, its deltas written as the engine loop writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from sdk import Client, StreamRestarted
from tests.integration.killable_redis import killable_redis
from tests.integration.stream_helpers import Apis, Caller, Worker, raw_sse, two_apis

KINDS = ["sse", "sdk", "openai"]
FIRST = "Once upon a "  # attempt 1's text before its worker died


@dataclass
class Seen:
    text: str  # what the client shows at the end (an SSE client clears it at `restarted`)
    handed: str  # every delta it was handed, joined (the SDK's and OpenAI's iteration)
    restarted: bool  # the SSE stream said `restarted`
    error: BaseException | None  # what the client raised


@pytest.fixture
def apis(tmp_path: Path) -> Iterator[Apis]:
    with killable_redis(tmp_path / "redis") as server, two_apis(tmp_path / "apis", server) as a:
        yield a


def call(apis: Apis, kind: str) -> Seen:
    if kind == "sse":
        got = raw_sse(apis)
        deltas = "".join(d["delta"] for e, d in got.events if e == "output")
        return Seen(got.text, deltas, any(e == "restarted" for e, _ in got.events), None)
    if kind == "sdk":
        with Client(base_url=apis.caller, api_key=apis.key, timeout=60) as client:
            stream = client.run("demo", {"prompt": "x"}, stream=True)
            handed: list[str] = []
            try:
                handed.extend(stream)
            except StreamRestarted as e:
                return Seen(e.job.text or "", "".join(handed), True, e)
            return Seen(stream.text, "".join(handed), False, None)
    oai = openai.OpenAI(base_url=apis.caller + "/v1", api_key=apis.key, max_retries=0)
    parts: list[str] = []
    try:
        for chunk in oai.completions.create(model="demo", prompt="x", stream=True):
            parts.extend(c.text for c in chunk.choices)
    except openai.APIError as e:
        return Seen("".join(parts), "".join(parts), False, e)
    finally:
        oai.close()
    return Seen("".join(parts), "".join(parts), False, None)


def start(apis: Apis, kind: str) -> tuple[Caller, Worker, str]:
    caller = Caller(lambda: call(apis, kind))
    worker = Worker(apis)
    return caller, worker, worker.job_waiting()


def lose_first_attempt(worker: Worker, job: str) -> int:
    """Attempt 1 streams FIRST, its worker dies, the job is claimed again: attempt 2."""
    first = worker.claim(job)
    worker.stream(job, first, FIRST)
    worker.lose(job, first)
    second = worker.claim(job)
    worker.stream(job, first, "tale")  # the lost worker, not dead yet, streamed on
    assert second == first + 1
    return second


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_that_repeats_the_text_streams_it_once(apis: Apis, kind: str) -> None:
    caller, worker, job = start(apis, kind)
    second = lose_first_attempt(worker, job)
    output = FIRST + "time, the river ran"  # greedy decoding: the retry says it again
    worker.stream(job, second, output, piece=3)
    worker.complete(job, second, output)
    seen = caller.join(30)
    assert seen.error is None and not seen.restarted
    assert seen.text == seen.handed == output, "one text, not attempt 1's followed by attempt 2's"
    worker.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_whose_text_departs_is_marked_never_mixed(apis: Apis, kind: str) -> None:
    caller, worker, job = start(apis, kind)
    second = lose_first_attempt(worker, job)
    output = "The river ran to the sea"
    worker.stream(job, second, output)
    worker.complete(job, second, output)
    seen = caller.join(30)
    assert FIRST.startswith(seen.handed) or seen.handed == FIRST + output
    if kind == "sse":  # told to discard its text, then sent the new attempt's
        assert seen.restarted and seen.text == output and seen.handed == FIRST + output
    elif kind == "sdk":  # handed attempt 1's text only, then the error with the true output
        assert isinstance(seen.error, StreamRestarted) and seen.error.job_id == job
        assert seen.handed == FIRST and seen.text == output
    else:  # an OpenAI stream cannot restart: an error naming the job, never attempt 2's text
        assert isinstance(seen.error, openai.APIError) and job in str(seen.error)
        assert seen.handed == FIRST
    worker.close()


@pytest.mark.parametrize("kind", KINDS)
def test_deltas_lost_in_a_redis_restart_are_filled_in_from_the_output(
    apis: Apis, kind: str
) -> None:
    caller, worker, job = start(apis, kind)
    attempt = worker.claim(job)
    output = "Across the hills the river ran to the sea, and on"
    worker.stream(job, attempt, output, lose={2, 3, 7})  # never reached Redis
    worker.complete(job, attempt, output)
    seen = caller.join(30)
    assert seen.error is None and not seen.restarted
    assert seen.text == seen.handed == output, "not a short text with a success ending"
    worker.close()
