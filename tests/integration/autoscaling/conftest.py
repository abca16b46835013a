"""The live autoscaler's fixtures: a frozen clock, and the fleet that plays the workers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.reconcile.driver import Reconciler
from tests.integration.autoscaling.fleet import Fleet, FrozenClock
from tests.integration.conftest import SteppedClock


@pytest.fixture
def clock() -> SteppedClock:
    return FrozenClock()


@pytest.fixture
def fleet(
    client: TestClient,
    keys: dict[str, str],
    loop: Reconciler,
    clock: SteppedClock,
    redis_client: Any,
) -> Fleet:
    return Fleet(client, loop, clock, redis_client, keys["a"])
