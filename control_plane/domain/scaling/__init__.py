"""The autoscaler's decision, as pure logic (contract: ../shared/DESIGN.md §8).

- `policy.py`: the policy and the prices (idle worker-second vs cold start);
- `history.py`: arrival counts, gap histogram and concurrency windows, as plain data;
- `forecast.py`, `idle.py`, `models.py`: the models refit off the hot path;
- `levels.py`: how long each worker above the last is held, from that count's own past;
- `decide.py`: `decide(state, now) -> ScaleDecision`, called every tick by the reconciler and
  by the simulator alike.
"""

from control_plane.domain.scaling.decide import (
    REASONS,
    DeploymentState,
    Memory,
    ScaleDecision,
    decide,
)
from control_plane.domain.scaling.history import (
    ArrivalHistory,
    ArrivalStats,
    ConcurrencyWindow,
)
from control_plane.domain.scaling.models import Models, refit
from control_plane.domain.scaling.policy import ScalingPolicy

__all__ = [
    "REASONS",
    "ArrivalHistory",
    "ArrivalStats",
    "ConcurrencyWindow",
    "DeploymentState",
    "Memory",
    "Models",
    "ScaleDecision",
    "ScalingPolicy",
    "decide",
    "refit",
]
