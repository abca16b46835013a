"""A sync job's end handed to its caller waiting in the same API process (`LocalEnds`): from
the thread that ends the job to the waiter's event loop."""

from __future__ import annotations

import asyncio
import threading

from common.protocol import EventType
from control_plane.services.jobs.local_ends import End, LocalEnds

DONE: End = (EventType.COMPLETED, {"id": "job_1", "status": "succeeded"})


def test_an_end_reaches_the_waiter_from_another_thread() -> None:
    ends = LocalEnds()

    async def scenario() -> End:
        future = ends.expect("job_1")
        threading.Thread(target=ends.deliver, args=("job_1", DONE)).start()
        try:
            return await asyncio.wait_for(future, 5)
        finally:
            ends.forget("job_1", future)

    assert asyncio.run(scenario()) == DONE


def test_only_the_first_end_counts_and_nothing_reaches_a_job_nobody_waits_for() -> None:
    ends = LocalEnds()
    later: End = (EventType.CANCELED, {"id": "job_1"})

    async def scenario() -> tuple[End, bool]:
        # before anyone waits: dropped (Redis carries it), and nobody was woken
        assert ends.deliver("job_1", DONE) is False
        future = ends.expect("job_1")
        await asyncio.sleep(0)
        assert not future.done()
        assert ends.deliver("job_1", DONE) is True
        ends.deliver("job_1", later)
        end = await asyncio.wait_for(future, 5)
        ends.forget("job_1", future)
        gone = ends.expect("job_2")
        ends.forget("job_2", gone)
        assert ends.deliver("job_2", DONE) is False  # its waiter left: nothing to wake
        await asyncio.sleep(0.01)
        return end, gone.done()

    assert asyncio.run(scenario()) == (DONE, False)


def test_two_callers_of_one_job_each_get_its_end_and_leave_apart() -> None:
    """A call replayed with its idempotency key waits on the same job as the first."""
    ends = LocalEnds()

    async def scenario() -> list[End]:
        first, replay = ends.expect("job_1"), ends.expect("job_1")
        ends.forget("job_1", first)  # the first caller left: the replay still waits
        ends.deliver("job_1", DONE)
        late = ends.expect("job_1")
        ends.deliver("job_1", DONE)
        return [await asyncio.wait_for(f, 5) for f in (replay, late)]

    assert asyncio.run(scenario()) == [DONE, DONE]


def test_a_waiter_whose_loop_closed_is_passed_over() -> None:
    ends = LocalEnds()

    async def wait() -> None:
        ends.expect("job_1")  # never forgotten: its loop closes under it

    asyncio.run(wait())
    ends.deliver("job_1", DONE)  # no RuntimeError: the announcement goes on
