"""A warm-pool worker's wait for its one assignment (a message in Redis,
`worker_assignment_key`), and the check that it may serve it: a pool worker prepared one
engine at its boot (`prepare_runtime(..., engine=...)`: vLLM's imports for a vLLM one) and
serves only deployments resolved to that engine.

The control plane never sends another engine's assignment (its plans choose pool workers by
engine, and the assignment of a pool worker's row is conditional on its engine); a worker that
got one anyway fails, its reason naming both engines, rather than serving a model on an engine
it never prepared (a built-in worker has no vLLM to import; a vLLM one runs in vLLM's
environment).
"""

from __future__ import annotations

import logging
import threading

import redis

from common.messages import Assignment
from common.protocol import worker_assignment_key

log = logging.getLogger(__name__)

# The wait is blocking pops of this long (then it checks whether it was asked to stop).
ASSIGNMENT_POLL_S = 1


class EngineMismatch(ValueError):
    """A pool worker was sent an assignment for an engine other than the one it prepared."""


def check_engine(assignment: Assignment, pool_engine: str) -> None:
    """Raises EngineMismatch unless the assignment's engine is the pool worker's own."""
    if assignment.engine != pool_engine:
        raise EngineMismatch(
            f"deployment {assignment.deployment_id} is on engine {assignment.engine!r}, but "
            f"this warm-pool worker prepared engine {pool_engine!r} (python -m worker --pool "
            f"--engine {pool_engine}); it serves only deployments on its own engine"
        )


def next_assignment(
    r: redis.Redis, worker_id: str, pool_engine: str, stop: threading.Event
) -> Assignment | None:
    """The assignment sent to this pool worker, checked against its engine; None when it was
    asked to stop first. ValueError (EngineMismatch among them): fails the worker."""
    key = worker_assignment_key(worker_id)
    while not stop.is_set():
        try:
            item = r.blpop([key], timeout=ASSIGNMENT_POLL_S)
        except redis.RedisError as exc:
            log.warning("assignment unreadable (Redis: %s); retrying", exc)
            stop.wait(ASSIGNMENT_POLL_S)
            continue
        if item is None:
            continue
        assignment = Assignment.from_json(item[1])
        check_engine(assignment, pool_engine)
        return assignment
    return None
