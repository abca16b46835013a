"""The oracle: a lower bound that knows every arrival and service time in advance.

With no request ever waiting, deployment demand is c(t) = requests in service and it needs
n(t) = ceil(c(t) / slots) workers. Worker k (the k-th level of n) is needed on the intervals
where n(t) ≥ k. Between two such intervals the oracle keeps the worker if it is needed again
within a boot (keeping costs the gap; releasing costs the boot), otherwise releases it when it
stops being needed and starts it again exactly one boot before the next interval. Workers are
interchangeable, so the schedule is a list of timed starts and releases; a released worker that
still holds requests drains them, and one started for level k is ready at the moment level k
is needed, so no request waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.autoscale.policies import Policy, workers_for

if TYPE_CHECKING:
    from bench.autoscale.sim import DeploymentRuntime
    from bench.autoscale.workloads import Deployment


class Oracle(Policy):
    name = "oracle"

    def schedule(self, dep: DeploymentRuntime) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        for intervals in need_intervals(dep.spec, self.slots):
            for start, end in merge_gaps(intervals, self.t_cold_s):
                out += [(start, +1), (end, -1)]
        return out


def need_intervals(dep: Deployment, slots: int) -> list[list[tuple[float, float]]]:
    """Per worker level k (index k - 1): the intervals on which n(t) ≥ k, in time order."""
    # +1 at arrival, -1 at completion; at equal times completions go first, as in the sim
    edges = sorted(
        [(r.arrival_s, 1) for r in dep.requests]
        + [(r.arrival_s + r.service_s, -1) for r in dep.requests]
    )
    levels: list[list[tuple[float, float]]] = []
    opened: list[float] = []  # [k - 1]: when level k last opened
    c = n = 0
    for t, delta in edges:
        c += delta
        m = workers_for(c, slots)
        while n < m:  # levels n + 1 .. m open
            if n == len(levels):
                levels.append([])
                opened.append(t)
            opened[n] = t
            n += 1
        while n > m:  # levels m + 1 .. n close
            n -= 1
            levels[n].append((opened[n], t))
    return levels


def merge_gaps(intervals: list[tuple[float, float]], gap_s: float) -> list[tuple[float, float]]:
    """Join intervals separated by at most `gap_s`."""
    merged: list[tuple[float, float]] = []
    for start, end in intervals:
        if merged and start - merged[-1][1] <= gap_s:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
