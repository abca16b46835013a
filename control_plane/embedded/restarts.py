"""When the embedded supervisor restarts a child that died, and when it gives up (pure).

A child that dies is started again after a back-off that doubles with each death in a row
(0.5 s, 1 s, 2 s, … capped at 30 s), so a crash at start does not spin the CPU. A child that
ran for `STABLE_S` before dying starts a new streak: one crash a day restarts at once. Too
many deaths soon after their start, in a short time, means the child cannot run here (a
broken config, a port taken): the supervisor gives up and stops the platform, saying which
child and where its log is. A child that had been running for a while and was then killed
(the OOM killer, an operator, a fault test) is not a crash loop, however often it happens:
it is restarted with the back-off, never given up on (the platform keeps serving).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FIRST_BACKOFF_S = 0.5  # the first restart is nearly at once: most deaths are one-offs
MAX_BACKOFF_S = 30.0  # never wait longer than this to try again
STABLE_S = 60.0  # a child that lived this long before dying starts a fresh streak
# Give up after this many deaths within the window: ~6 back-offs in 5 minutes is a child
# that cannot run, not an unlucky one.
MAX_DEATHS = 6
DEATH_WINDOW_S = 300.0
# A death this soon after the child's start counts towards giving up: every child here is
# serving within a second or two of its start (Redis replays its AOF, the API imports), so a
# child that dies before this could not run; one that lived longer ran, and was stopped.
CRASH_S = 10.0


@dataclass(frozen=True, slots=True)
class RestartVerdict:
    give_up: bool
    restart_at: float  # monotonic seconds; meaningless when give_up


def after_death(deaths: Sequence[tuple[float, float]], now: float) -> RestartVerdict:
    """`deaths`: (started_at, died_at) of each death of this child, oldest first, the newest
    being the one that just happened."""
    recent = [d for d in deaths if now - d[1] <= DEATH_WINDOW_S]
    crashes = [d for d in recent if d[1] - d[0] < CRASH_S]
    if len(crashes) >= MAX_DEATHS:
        return RestartVerdict(give_up=True, restart_at=now)
    streak = 0
    for started_at, died_at in reversed(recent):
        streak += 1
        if died_at - started_at >= STABLE_S:
            break
    backoff = min(FIRST_BACKOFF_S * 2 ** (streak - 1), MAX_BACKOFF_S)
    return RestartVerdict(give_up=False, restart_at=now + backoff)
