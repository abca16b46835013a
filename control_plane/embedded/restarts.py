"""When the embedded supervisor restarts a child that died, and when it gives up (pure).

A child that dies is started again after a back-off that doubles with each death in a row
(0.5 s, 1 s, 2 s, … capped at 30 s), so a crash at start does not spin the CPU. A child that
ran for `STABLE_S` before dying, or had answered its readiness check, started fine: its death
starts a new streak (it is restarted at once) and never counts towards giving up. Too
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
# A child that lived this long before dying had started fine: its death starts a fresh streak
# (restarted at once) and does not count towards giving up. Every child here serves within a
# second or two of its start (Redis replays its AOF, the API imports), so one that died
# sooner could not run, and one that lived longer ran and was stopped. NOTE: it was 60 s; a
# Redis killed every 10-15 s (the long-form fault run) then waited 16 s by its sixth restart,
# long enough for the workers' heartbeats to lapse.
STABLE_S = 10.0
# Give up after this many deaths within the window: ~6 back-offs in 5 minutes is a child
# that cannot run, not an unlucky one.
MAX_DEATHS = 6
DEATH_WINDOW_S = 300.0


@dataclass(frozen=True, slots=True)
class RestartVerdict:
    give_up: bool
    restart_at: float  # monotonic seconds; meaningless when give_up


Death = tuple[float, float] | tuple[float, float, bool]


def started_fine(death: Death) -> bool:
    """It ran `STABLE_S`, or it had passed its readiness check (a store answers on its port
    before its start returns) before it died."""
    return death[1] - death[0] >= STABLE_S or (len(death) > 2 and bool(death[2]))


def after_death(deaths: Sequence[Death], now: float) -> RestartVerdict:
    """`deaths`: (started_at, died_at[, ready]) of each death of this child, oldest first, the
    newest being the one that just happened; `ready`: it had passed a readiness check."""
    recent = [d for d in deaths if now - d[1] <= DEATH_WINDOW_S]
    crashes = [d for d in recent if not started_fine(d)]
    if len(crashes) >= MAX_DEATHS:
        return RestartVerdict(give_up=True, restart_at=now)
    streak = 0
    for d in reversed(recent):
        streak += 1
        if started_fine(d):
            break
    backoff = min(FIRST_BACKOFF_S * 2 ** (streak - 1), MAX_BACKOFF_S)
    return RestartVerdict(give_up=False, restart_at=now + backoff)
